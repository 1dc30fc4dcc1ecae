"""Vision-LSTM: ViL and the windowed AMViL (:mod:`.vil`) and their mLSTM layer."""
from .vil import VIL_ARCHS, AMViL, ViL

__all__ = ['ViL', 'AMViL', 'VIL_ARCHS']
