"""L5: golden outputs — generate them with mpt, verify any backend's outputs against them.

A *suite* is a folder::

    manifest.json        schema, versions, and per case: kind, parameters, contract, and for
                         every array its dtype, shape and sha256; the sha256 of each case file;
                         the suite's digest
    <case>.npz           the case's inputs ("in.<name>") and mpt's outputs ("out.<name>")

Arrays are stored as plain numpy arrays, except ml_dtypes ones (bf16, fp8, ...) which are stored as
their unsigned bit patterns and viewed back through the dtype named in the manifest, so files load
with ``allow_pickle=False``. Before anything is loaded, the file's sha256 is checked against the
manifest, then each array's: a corrupted or edited file is reported, never used.

**Manifest** (``schema_version`` 2). A JSON object with exactly these fields:

- ``schema_version``: 2; ``suite``: a string; ``versions``: an object of strings (the mpt, numpy
  and ml_dtypes that wrote it); ``digest``: the suite digest (below);
- ``cases``: a non-empty list of objects with exactly ``name`` (a plain file name:
  ``[A-Za-z0-9][A-Za-z0-9_.-]*``, at most 200 characters, no ``..``; unique ignoring case),
  ``kind`` (a registered kind, or ``"pytest"`` for the fixture's cases), ``params`` (an object),
  ``contract`` (``{"max_ulp": int in [0, 2**64), "text": "bit-exact" | "<= N ULP"}``), ``file``
  (always ``<name>.npz``), ``file_sha256`` and ``arrays`` (``"in.<x>"``/``"out.<y>"`` → ``{"dtype",
  "shape", "sha256"}``, at least one output).

The whole manifest is checked before any case file is opened or any output written; a manifest
that breaks a rule raises :class:`GoldenError` naming the field (``cases[3].contract.max_ulp
must be an integer; got 1e+30``). JSON with NaN/Infinity or a repeated key is refused. Files are
read only from inside their folder: case files by their checked base name, never through a
symbolic link.

**Suite digest.** ``digest = sha256(C(manifest without its "digest" field))`` in hex, where
``C`` is the canonical JSON serialisation ``json.dumps(obj, sort_keys=True, separators=(",",
":"), ensure_ascii=True, allow_nan=False)`` encoded as ASCII. The manifest holds the sha256 of
every case file (and of every array), so the digest pins the manifest and, through those hashes,
every byte of the suite. ``read_manifest`` refuses a manifest whose stored digest does not match
(edited by hand); ``verify(..., expect_digest=HEX)`` (CLI ``--expect-digest``) refuses a suite
that is not the pinned one, and every case file is checked against its hash as it is loaded;
:func:`suite_digest` checks manifest and files and returns the digest.

A *backend's outputs* folder holds ``<case>.npz`` with one array per output name, either in the
output's dtype, as its unsigned bit patterns, or as wider floats that hold the values exactly
(what ``torch.Tensor.float()`` writes). ``verify`` compares them case by case under each case's
contract: bit-exact, or at most N ULP of the output format. A report that compared no case never
passes.

**Writing.** :func:`write_suite` writes a new suite into a temporary folder beside the target
and swaps it in. It refuses a path that is a file or a symbolic link and a non-empty folder that
holds no suite; it replaces an existing suite only with ``force=True``, only when that folder
holds nothing but the suite's files, and then deletes only the files the old manifest lists.

Case *kinds* map inputs and parameters to outputs (``KINDS``: ``round`` here, mma, gemm,
fake_quant, optim, grad_scaler, attention and train_steps in :mod:`mpt.golden.kinds`); ``run_mpt``
recomputes every case with mpt itself, so ``generate → run_mpt → verify`` must be bit-exact
everywhere. Integer and boolean outputs (masks, counters) must be equal. The committed default
suite (``reference_results/default``) is mpt's numerics regression test: ``generate`` must
reproduce every array hash (tests/test_golden.py); regenerate it when numerics change on purpose.
PyTorch's side: :mod:`mpt.golden.torch`.
"""
from mpt.golden.manifest import (ARRAY_NAME, FIXTURE_KIND, MANIFEST, SCHEMA_VERSION, Case,
                                 GoldenError, build_manifest, check_digest, manifest_digest,
                                 read_manifest, suite_digest)
from mpt.golden.suite import (KINDS, SUITES, check_target, compute_outputs, describe_array,
                              generate, load_case, load_suite, outputs_folder, register_kind,
                              run_mpt, save_npz, write_case, write_json_atomic, write_manifest,
                              write_suite)
from mpt.golden.verify import format_report, passed, verify


__all__ = [
    "SCHEMA_VERSION", "MANIFEST", "FIXTURE_KIND", "Case", "KINDS", "SUITES", "register_kind",
    "generate", "write_suite", "load_suite", "run_mpt", "verify", "GoldenError", "save_npz",
    "load_case", "describe_array", "read_manifest", "passed", "format_report",
    "write_json_atomic", "suite_digest", "manifest_digest", "check_digest", "build_manifest",
    "write_case", "write_manifest", "outputs_folder", "compute_outputs", "ARRAY_NAME",
    "check_target",
]
