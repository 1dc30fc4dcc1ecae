"""The GPU suite's ViL comparison (amvim_mm/bench/official_vil.py) on a CPU: a wrong checkout is
a one-line error, and our side of the pair is the pooled backbone + a linear head."""
import pytest
import torch

from amvim_mm.bench import official_vil as OVIL
from amvim_mm.errors import ConfigError


def test_wrong_checkout_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match='not a checkout of NX-AI/vision-lstm'):
        OVIL.official_package(str(tmp_path))
    with pytest.raises(ConfigError, match="no official VisionLSTM2 for 'huge'"):
        OVIL._official_config('huge', 224)


def test_classifier_is_pooled_backbone_and_head():
    torch.manual_seed(0)
    m = OVIL.ViLClassifier('test', img_size=32, num_classes=7).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        pooled = m.backbone(x)[-1]
        assert pooled.shape == (2, 2 * m.backbone.embed_dims)
        assert torch.equal(m(x), m.head(pooled))
