"""L5: ``mpt study`` — train one small GPT under every precision recipe and compare what each did.

**Workload.** ``mpt.nn.GPT`` (default: vocabulary 32, d_model 64, two blocks of four heads,
context 16, batch 16; about 2 minutes for every recipe and the quantization sections on two
cores) learns a random first-order Markov chain (``mpt.train.corpus.MarkovCorpus``) whose
entropy rate ``H`` is the best achievable loss; ``--text FILE`` trains on the file's bytes instead
(vocabulary 256, no known optimum). Every recipe starts from the same FP32 initialisation and sees
the same batches, so the differences between rows are the recipes' alone. ``seed`` sets the
initialisation, the order of the training batches and the stochastic-rounding key;
``corpus_seed`` the chain (the held-out batches depend on it alone). AdamW (β = (0.9, 0.95), no
weight decay, eps 1e-8), learning rate 3e-3 with 20 warm-up steps and cosine decay to 3e-4, 400
steps. The Numba kernels run on one thread (small tensors: faster, and the bits never depend on
it). Attention is FlashAttention-2 (``attention="flash"``) where its kernels run every recipe's
GEMM model on the target, else the naive backend for every recipe alike (``"naive"``: AMD
targets, whose MFMA models run through ``mpt.gemm`` only).

**Why the loss is multiplied by 2⁻¹¹.** The gradient of a mean loss over ``N`` tokens carries a
factor ``1/N``: the logits gradient of one token is ``(softmax − onehot)/N``. A real run averages
over its whole batch — GPT-3 Small used 0.5M = 2¹⁹ tokens per step (Brown et al. 2020, Table
2.1), and Megatron-LM divides each micro-batch's loss by the number of micro-batches it
accumulates — so each micro-batch backward sees gradients ``2¹⁹/n`` times smaller than the mean
over its own ``n`` tokens. The study's micro-batch has ``n = 16·16 = 2⁸`` tokens; multiplying its
mean loss by ``n/2¹⁹ = 2⁻¹¹`` gives its backward the gradient magnitudes of such a run (the
default ``global_batch_tokens = 2**19``). That is conservative: with GPT-2's 50257-token
vocabulary instead of 32, the probabilities, hence the logits gradients, of the non-target tokens
are about 2¹¹ times smaller again. AdamW's update does not depend on the gradient scale (except
through ``eps``), so the FP32 run barely notices the factor; FP16 without loss scaling does — the
effect loss scaling exists for (Micikevicius et al., ICLR 2018). Setting ``global_batch_tokens``
to the micro-batch's size turns the factor off (then FP16 flushes far fewer gradients: the
study reports what it measures, it does not assume it).

**Table columns.** ``final loss``: mean loss on 8 held-out batches with the recipe's own forward
(no dropout); ``gap fp32``: minus the fp32 row's; ``skipped``: steps the loss scaler skipped;
``scale``: the final loss scale; ``underflow %``: share of the non-zero gradient values flushed
to zero at the casts the trainer measures exactly — the logits gradient (as scaled) rounded into
the backward format (the first rounding of every backward pass) and, for FP8 layers, the E5M2
quantization of their output gradients; ``zero grads %``: parameter-gradient elements that are
exactly zero (the consequence); ``lost upd %``: for recipes without master weights, the share of
the elements whose FP32 update left the low-precision weight unchanged (below half an ULP);
``B/param``: bytes per parameter of weights + gradients + master + AdamW states
(``mpt.planning``); ``qerr %`` and ``sat %``: for the block-scaled recipes (``mxfp8``,
``nvfp4`` and its ablations ``nvfp4-no-rht`` / ``-no-sr`` / ``-no-2d``, ``mxfp4``; on a target
with block-scaled MMA, ``--target b200``), the relative quantization error of their GEMM operands
over the run and the share of non-zero inputs clamped at their block's largest code;
``time s``: wall time of the recipe's run.

**Across chips** (``compare_targets``, ``mpt study --compare-targets``; off by default): the
same network trained under ``bf16-amp`` and each chip's own recipes on the models of H100,
MI300X (A100 where mpt has no MI300X target), a TPU, Gaudi 3 and Trainium2 side by side —
``mpt.study.targets``. ``--target T`` runs the main table on another chip: every recipe
``mpt.recipes_for(T)`` lists.

**Quantization sections** (``quant``, default on for the Markov corpus; ``--no-quant`` skips
them): QAT vs post-training quantization of a bigram MLP into integer-only models, and LoRA
fine-tunes over fp16/bf16/int8/NF4 bases — ``mpt.study.quant``; their step counts scale with
``steps``.

The report folder holds ``report.md``, ``study.json`` (every step's metrics) and, with matplotlib
installed (``pip install 'mpt[plot]'``), PNG plots: loss curves, loss-scale trajectories, lost
updates, and the gradient-magnitude histogram of the FP32 run against the FP16 range.

**Grids** (``mpt study --grid``, :mod:`mpt.study.grid`): recipes × seeds × model sizes × learning
rates, one task per cell, serially or on Dask (``pip install 'mpt[dask]'``), with the final loss
over the seeds (mean and spread) and the recipe differences that exceed the spread
(:mod:`mpt.study.aggregate`); report in :mod:`mpt.study.grid_report`.
"""
from mpt.study.config import StudyConfig
from mpt.study.quant import format_quant_sections
from mpt.study.report import format_table, table_rows, write_report
from mpt.study.run import RecipeRun, StudyResult, run_recipe, run_study
from mpt.study.aggregate import Comparison, SeedStats
from mpt.study.grid import (MODEL_SIZES, GridCell, GridConfig, GridResult, ModelSize, cell_seed,
                            derive_seed, model_size, run_cell, run_grid)
from mpt.study.grid_report import format_grid_table, write_grid_report


__all__ = ["StudyConfig", "RecipeRun", "StudyResult", "run_study", "run_recipe", "format_table",
           "table_rows", "format_quant_sections", "write_report",
           # grids
           "GridConfig", "GridCell", "GridResult", "ModelSize", "MODEL_SIZES", "model_size",
           "derive_seed", "cell_seed", "run_cell", "run_grid", "SeedStats", "Comparison",
           "format_grid_table", "write_grid_report"]
