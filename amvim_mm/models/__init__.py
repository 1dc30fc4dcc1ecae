from .backbones import AMVim, LocalVim, PlainMamba, Vim, VMamba  # noqa: F401  (registers the backbones)
from .heads import TokenGrid  # noqa: F401  (registers the per-token heads)
from .necks import PlainPyramidNeck, SimpleFeaturePyramid  # noqa: F401
from .reduction import TOKEN_REDUCERS  # noqa: F401  (registers the token reducers)
from .reducer_finetuner import ReducerFineTuner  # noqa: F401  (registers the fine-tuning wrapper)
from .segmentors import label_map, use_label_map  # noqa: F401  (registers LabelMapEncoderDecoder)
