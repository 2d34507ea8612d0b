"""polygrad-hf: Hugging Face checkpoints (GPT-2, Llama, Qwen2, Phi-3, Gemma, Gemma 2;
safetensors and GGUF) as polygrad Models.

Imported as `polygrad.hf` or `polygrad_hf`:

    from polygrad.hf import download_hf, load_hf, generate
    model = load_hf(download_hf("gpt2"), max_batch=1, max_seq_len=128)
    tokens = generate(model, [[464, 2068]], max_new_tokens=20, temperature=0.8, top_k=40, seed=0)

Modules, in pipeline order: download (huggingface_hub), checkpoint + gguf_file + gguf_format (reading;
GGUF without the gguf package), config (the DecoderConfig), decoder (the graph), loader (load_hf: the
Model), generate (sampling loop), tokenizer (the optional tokenizers helper).
"""
from polygrad_hf.download import download_hf
from polygrad_hf.errors import CheckpointError, HFError, MissingDependencyError, UnsupportedModelError
from polygrad_hf.generate import generate
from polygrad_hf.loader import load_hf
from polygrad_hf.tokenizer import Tokenizer, load_tokenizer

__version__ = "0.1.0"

__all__ = ["CheckpointError", "HFError", "MissingDependencyError", "Tokenizer", "UnsupportedModelError",
           "download_hf", "generate", "load_hf", "load_tokenizer", "__version__"]
