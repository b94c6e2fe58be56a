"""The quantization sections of ``mpt study`` (mpt.study_quant): QAT vs PTQ of a bigram MLP into
integer-only models, LoRA over fp16/bf16/int8/NF4 bases, and their place in the study's output."""
import copy
import json
import math

import numpy as np
import pytest

import mpt.quant as Q
import mpt.study.quant as SQ
from mpt.autograd.tensor import Tensor, no_grad
from mpt.cli import main
from mpt.study import StudyConfig, run_study, write_report
from mpt.train.corpus import MarkovCorpus

STUDY = StudyConfig()
CORPUS = MarkovCorpus(STUDY.vocab, STUDY.sharpness, seed=STUDY.corpus_seed)


@pytest.fixture(scope="module")
def qat():
    """The default QAT vs PTQ section (about 3 s)."""
    return SQ.run_qat_vs_ptq(SQ.QuantStudyConfig(), STUDY, CORPUS).rows


def test_qat_beats_ptq_where_weights_are_coarse(qat):
    gap = {name: row.loss - qat["fp32"].loss for name, row in qat.items()}
    # The fp32 model is near the chain's optimum (entropy rate 2.1943): within 0.03 nats.
    assert qat["fp32"].loss - CORPUS.entropy_rate < 0.03
    # int8 PTQ: per-channel 8-bit weights, 7-bit activations. The logits' rounding error is
    # uniform with step s (the output scale), adding about s²/24 nats (second order:
    # ½·(s²/12)·Σ p(1−p) ≤ s²/24); s = range/127, a logit range of 16 gives 7e-4, and the hidden
    # layer's rounding adds its share: 2e-3 leaves room for both (measured +6e-4).
    assert 0 <= gap["ptq-int8"] < 2e-3
    # 4-bit weights: PTQ loses what QAT wins back. The QAT fine-tune's own gain is measured by the
    # fp32 control (same steps, batches, learning rate, no fake quantization): QAT's improvement
    # over PTQ must exceed it many times over. Measured: PTQ +0.025, QAT +0.006, control −0.001.
    control = abs(gap["fp32 + tune"])
    for scheme in ("w4a8", "w4a4"):
        gain = gap[f"ptq-{scheme}"] - gap[f"qat-{scheme}"]
        assert gain > 10 * control and gain > gap[f"qat-{scheme}"] / 2, (scheme, gap)
    assert gap["qat-w4a8"] < gap["ptq-w4a8"] / 3
    # weight bytes: fp32 4 per weight and bias; b-bit codes packed + fp32 scale + int32 bias
    weights, channels = 32 * 64 + 64 * 32, 64 + 32
    assert qat["fp32"].weight_bytes == 4 * (weights + channels)
    assert qat["ptq-int8"].weight_bytes == weights + 8 * channels
    assert qat["qat-w4a4"].weight_bytes == weights // 2 + 8 * channels


def _ptq_model(scheme):
    model = SQ.BigramMLP(CORPUS.vocab, 64)
    SQ._train(model, lambda step, micro: CORPUS.batch(16, 16, "mlp.0", step), 200, 1e-2, 0)
    calib = [CORPUS.batch(16, 16, "calib.0", k) for k in range(4)]
    rows = SQ._quantized(model, scheme, calib, None, calib)
    prepared = Q.prepare_qat(copy.deepcopy(model), SQ._qconfig(scheme), fuse_relu=("fc1",))
    for fq in SQ._fake_quantizers(prepared):
        fq.disable_fake_quant()
    with no_grad():
        for idx, _ in calib:
            prepared(idx)
    for fq in SQ._fake_quantizers(prepared):
        fq.enable_fake_quant().disable_observer()
    return prepared, rows


@pytest.mark.parametrize("scheme", [(8, 8), (4, 8)])
def test_integer_hidden_codes_equal_fake_quant_except_at_bias_rounding_ties(scheme):
    """Hidden layer, every token: the exact pre-rounding code ``r = (x·w_fq + b)/So + zo``
    (float64 from the fake-quant values; x = the dequantized one-hot) differs from the integer
    layer's by the int32 bias rounding, at most ``M_c/2`` codes with ``M_c = Sx·Sw_c/So``, plus
    the rounding of SRDHM's product before the rounding right shift by ``n``, at most
    ``2^-(n+1)`` codes (``M_c ≈ M0·2^(shift−31)``, ``n = −shift``; mpt.quant.convert), plus
    float32 and multiplier roundings (< 2^-16 codes here): codes may differ (by one) only that
    close to a tie."""
    fq_model, _ = _ptq_model(scheme)
    int_model = Q.convert(copy.deepcopy(fq_model))
    onehot = Tensor(np.eye(CORPUS.vocab, dtype=np.float32)[None])              # (1, V, V)
    with no_grad():
        q_int = int_model.fc1(int_model.quant(onehot)).q[0].astype(np.int64)   # (V, H)
        x_fq = fq_model.quant(onehot).data[0].astype(np.float64)              # (V, V)
        w_fq = fq_model.fc1.weight_fake_quant(fq_model.fc1.weight).data.astype(np.float64)
    out = fq_model.fc1.activation_post_process
    so, zo = np.float64(out.scale[0]), int(out.zero_point[0])
    r = (x_fq @ w_fq.T + fq_model.fc1.bias.data.astype(np.float64)) / so + zo  # (V, H)
    q_fq = np.clip(np.rint(r), max(out.quant_min, zo), out.quant_max).astype(np.int64)
    m = np.float64(int_model.quant.scale) * int_model.fc1.weight_scale.astype(np.float64) / so
    _, _, shift = int_model.fc1.requant_params(int_model.quant.scale)
    assert (shift <= 0).all()
    bound = m / 2 + np.ldexp(1.0, shift.astype(np.int64) - 1) + 2.0**-16       # (H,)
    near_tie = np.abs(r - np.floor(r) - 0.5) <= bound                          # (V, H)
    assert np.abs(q_int - q_fq).max() <= 1
    assert np.array_equal(q_int[~near_tie], q_fq[~near_tie])
    assert (q_int != q_fq).any() or scheme == (8, 8)   # w4: M is 8x larger, ties do occur


def test_integer_model_loss_tracks_fake_quant_model():
    _, rows = _ptq_model((8, 8))
    # Differing codes (near ties, above) change a logit by one step s, a share p of them; the loss
    # moves by at most about p·s per token. Measured p < 2.5 %, s < 0.15: bound 5e-3.
    assert rows.int_equals_fake_quant > 0.95
    assert abs(rows.loss - rows.fake_quant_loss) < 5e-3


@pytest.fixture(scope="module")
def lora_rows():
    config = SQ.QuantStudyConfig(lora_base_steps=150, lora_steps=60, lora_ranks=(4,))
    return SQ.run_lora(config, STUDY, CORPUS)


def test_lora_every_base_improves_and_full_fine_tune_is_best(lora_rows):
    rows = lora_rows.rows
    none, full = rows["no fine-tune"].loss, rows["full fp32"].loss
    # The shifted chain is unrelated to the old: the base predicts it worse than uniform (ln 32).
    assert none > math.log(32)
    # Every base: the frozen embeddings and tied head leave r = 4 adapters well short of the full
    # fine-tune, but each recovers over a quarter of its gain (measured 40 % after 60 steps), and
    # the base format hardly matters: the four finish within 0.01 nats (measured 0.002).
    losses = [rows[f"lora r=4 {fmt}"].loss for fmt in SQ.LORA_FORMATS]
    for fmt, loss in zip(SQ.LORA_FORMATS, losses):
        assert full < loss < none - (none - full) / 4, (fmt, loss)
    assert max(losses) - min(losses) < 0.01
    # the stored bases of each block's four Linears (qkv 3d x d, out d x d, fc1 4d x d, fc2
    # d x 4d; d = d_model)
    d = STUDY.d_model
    shapes = [(3 * d, d), (d, d), (4 * d, d), (d, 4 * d)] * STUDY.n_layers
    w = sum(o * i for o, i in shapes)
    assert rows["no fine-tune"].base_bytes == 4 * w
    assert rows["lora r=4 fp16"].base_bytes == rows["lora r=4 bf16"].base_bytes == 2 * w
    assert rows["lora r=4 int8"].base_bytes == w + 4 * sum(o for o, _ in shapes)
    assert rows["lora r=4 nf4"].base_bytes == w // 2 + 4 * (w // 64)
    trainable = sum(4 * (o + i) for o, i in shapes)
    assert rows["lora r=4 nf4"].trainable == trainable
    assert rows["lora r=4 nf4"].train_bytes == 16 * trainable      # fp32 weight, grad, m, v
    assert rows["full fp32"].train_bytes == 16 * lora_rows.parameters
    # frozen: the nf4 base plus the fp32 rest (embeddings, LayerNorms) and bf16 biases
    rest = lora_rows.parameters - w - sum(o for o, _ in shapes)
    assert rows["lora r=4 nf4"].frozen_bytes == rows["lora r=4 nf4"].base_bytes + 4 * rest \
        + 2 * sum(o for o, _ in shapes)
    # B = 0 at the start: the adapted model is the stored base; fp16 keeps the fp32 base's loss on
    # the old task to 1e-3 (relative weight error 2^-11), NF4 costs more than int8.
    old = {fmt: rows[f"lora r=4 {fmt}"].base_loss for fmt in SQ.LORA_FORMATS}
    assert abs(old["fp16"] - rows["no fine-tune"].base_loss) < 1e-3
    assert old["nf4"] > old["int8"]


def test_study_runs_and_reports_the_sections(tmp_path, capsys):
    result = run_study(StudyConfig(steps=2, recipes=("fp32",)))
    text = SQ.format_quant_sections(result.quant)
    assert text.startswith("QAT vs PTQ") and "lora r=8 nf4" in text and "qat-w4a8" in text
    paths = write_report(result, tmp_path / "r", plots=False)
    md = paths["report"].read_text()
    assert "## QAT vs post-training quantization" in md and "| lora r=4 int8 |" in md
    data = json.loads(paths["json"].read_text())
    assert set(data["quant"]["qat_vs_ptq"]["rows"]) >= {"fp32", "ptq-int8", "qat-int8"}
    assert main(["study", "--recipes", "fp32", "--steps", "1", "--out", str(tmp_path / "o"),
                 "--quiet", "--no-plots", "--no-quant"]) == 0
    printed = capsys.readouterr().out
    assert "QAT vs PTQ" not in printed
    assert json.loads((tmp_path / "o" / "study.json").read_text())["quant"] is None


def test_config_validation():
    with pytest.raises(ValueError, match="schemes"):
        SQ.QuantStudyConfig(schemes=((1, 8),))
    with pytest.raises(ValueError, match="lora_formats"):
        SQ.QuantStudyConfig(lora_formats=("fp8",))
    assert SQ.QuantStudyConfig.for_steps(400) == SQ.QuantStudyConfig()
