"""Renderers: kernel IR (ProgramSpec) -> source text for a device."""
