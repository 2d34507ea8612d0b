"""polygrad.nn: layers, state dicts and safetensors I/O (optimizers live in polygrad.nn.optim).

Layers are plain classes holding Tensors (tinygrad style) with torch.nn's names, shapes and
initialisation; `Context(TRAINING=1)` (or `Tensor.training = True`) switches Dropout and BatchNorm
to training behaviour.

>>> from polygrad import Tensor
>>> from polygrad.nn import Linear, get_parameters
>>> [p.shape for p in get_parameters(Linear(4, 2))]
[(2, 4), (2,)]
"""
from polygrad.nn import optim, state
from polygrad.nn.layers import (Conv1d, Conv2d, ConvTranspose1d, ConvTranspose2d, Dropout, Embedding, Linear, LSTMCell,
                                is_training)
from polygrad.nn.norm import (BatchNorm, BatchNorm1d, BatchNorm2d, BatchNorm3d, GroupNorm, InstanceNorm, InstanceNorm1d,
                              InstanceNorm2d, InstanceNorm3d, LayerNorm, LayerNorm2d, RMSNorm)
from polygrad.nn.state import (get_parameters, get_state_dict, load_state_dict, safe_load, safe_load_metadata,
                               safe_save)

__all__ = [
    "BatchNorm", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "Conv1d", "Conv2d", "ConvTranspose1d", "ConvTranspose2d",
    "Dropout", "Embedding", "GroupNorm", "InstanceNorm", "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d",
    "LSTMCell", "LayerNorm", "LayerNorm2d", "Linear", "RMSNorm", "get_parameters", "get_state_dict", "is_training",
    "load_state_dict", "optim", "safe_load", "safe_load_metadata", "safe_save", "state",
]
