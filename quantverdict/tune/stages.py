"""A recipe search's candidates: each stage's alternatives, each tried on top of the best of the stages before it
(:func:`quantverdict.tune.search.search`).

The search space was chosen on EfficientNet-Lite0 and -Lite1: bias correction is not in it, since on Lite0's
held-out quarters it gained 0.5 dB where GPTQ gained 3.6 dB, at three times GPTQ's time, and lost on top of it.
"""
from __future__ import annotations

from quantverdict.precision.settings import RecipeSettings
from quantverdict.tune.auto import AutoSettings
from quantverdict.tune.fallback import layers_kept

CALIBRATORS = [RecipeSettings(calibration="max"), RecipeSettings(calibration="percentile"),
               RecipeSettings(calibration="mse")]
MIGRATION = [RecipeSettings(smoothquant=0.5), RecipeSettings(smoothquant=0.8), RecipeSettings(equalize=True)]
ROUNDING = [RecipeSettings(gptq=True)]


def stages(auto: AutoSettings, layers: int) -> list[list[RecipeSettings]]:
    """Each stage's alternatives, each tried on top of the best of the stages before it. Fallback comes before
    weight rounding: a technique is judged by its gain in output SNR, and the few layers fallback keeps in FP16
    carry most of the noise, and while they do, rounding the other layers better moves the output's SNR little
    (noise powers add: halving a third of it gains 0.8 dB; the same, once the rest is gone, 3 dB). The calibrators
    are tried once more at the end, with the other choices made: which range is best (clipping noise against
    rounding noise) depends on which layers stay quantized and how much their weights' rounding adds. Fallback keeps
    each layer in the narrowest of ``wider_formats`` that holds it
    (:func:`quantverdict.tune.fallback.fallback_per_part`): FP16, and FP32 where FP16 flushes magnitudes below 6e-8
    to zero or overflows past 65504 (an untrained MobileNetV3-small's logits, ~1e-9: 0 dB in FP16)."""
    fallback = [[RecipeSettings(fallback=auto.max_fallback, fallback_format=auto.wider_formats)]]
    return [CALIBRATORS, MIGRATION, *(fallback if layers_kept(auto.max_fallback, layers) > 0 else []), ROUNDING,
            CALIBRATORS]
