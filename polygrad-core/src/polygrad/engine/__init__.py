"""The execution pipeline: schedule -> lower -> render -> compile -> run."""
