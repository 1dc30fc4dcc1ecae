from .runner import load_config, load_model_weights, make_runner

__all__ = ['load_config', 'make_runner', 'load_model_weights']
