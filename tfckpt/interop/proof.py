"""``tfckpt verify SRC --against OUT``: a conversion proved, tensor by tensor, bit for bit.

:func:`verify_against` plans again what made ``OUT`` from ``SRC`` — the same preset,
rules file, map, value transforms and casts — and compares the output with it
(:func:`~tfckpt.interop.comparing.compare`): every output tensor, and every source
tensor accounted for.
"""

from __future__ import annotations

from tfckpt.errors import CheckpointError
from tfckpt.interop.comparing import TENSOR_FILES, Proof, compare, open_output, output_path
from tfckpt.interop.export import close_opened, plan_export
from tfckpt.interop.presets import plan_preset
from tfckpt.interop.presets.loading import verify_config
from tfckpt.io.storage import StorageOptions, normalize, storage_for
from tfckpt.rewrite.options import Options
from tfckpt.rewrite.planner import plan
from tfckpt.rewrite.rulesfile import load_rules, with_rules


def verify_against(
    src,
    out,
    options: Options | None = None,
    *,
    preset: str | None = None,
    rules=None,
    storage_options: StorageOptions | None = None,
    keep_keys: bool = False,
    with_optimizer: bool = False,
    with_bookkeeping: bool = False,
    **changes,
) -> Proof:
    """Check ``out`` against what ``src`` becomes with ``preset`` (a model directory
    an export with a preset wrote), or ``rules`` (a rules file) and the ``options``
    (amended by keyword arguments: ``name_map``, ``permute``, ``cast``, ``overflow``...)
    it was made with.

    ``out`` is a model directory (its ``model.safetensors.index.json`` or
    ``model.safetensors``), safetensors files, an npz or a checkpoint; an export's
    ``keep_keys``, ``with_optimizer`` and ``with_bookkeeping`` as it was given them.
    Reads every tensor of both in bounded chunks; writes nothing. With ``preset``, the
    directory's ``config.json`` is loaded by transformers too
    (:func:`~tfckpt.interop.presets.loading.verify_config`): a config it refuses fails
    the proof (``config_problems``).

    >>> proof = verify_against("bert/bert_model.ckpt", "hf/", preset="hf-bert")
    >>> proof.ok, proof.checked, proof.mismatched, proof.unaccounted
    """
    options = Options.of(options, **changes, overwrite=True)  # it is there: read, not written
    if rules is not None:
        options = with_rules(options, load_rules(rules))
    out = normalize(out)
    store = storage_for(out, storage_options)
    path = output_path(store, out)
    if preset is not None:
        if not path.endswith(TENSOR_FILES):
            raise CheckpointError("a preset's output is a model directory", path=out)
        p, _, _ = plan_preset(
            src,
            store.dirname(path),
            preset,
            options,
            output_config=True,  # hf-tf2 plans from the config the export copied
            storage_options=storage_options,
        )
    elif path.endswith(TENSOR_FILES):
        named = path[: -len(".index.json")] if path.endswith(".index.json") else path
        p = plan_export(
            src,
            named,
            options,
            storage_options=storage_options,
            keep_keys=keep_keys,
            with_optimizer=with_optimizer,
            with_bookkeeping=with_bookkeeping,
            skip_unsupported=True,  # what the output could not hold is left out, and listed
        )
    else:
        p = plan(src, path, options, storage_options=storage_options, writes=False)
    try:
        with open_output(store, path, storage_options) as output:
            proof = compare(p, output, path)
    finally:
        close_opened(p, src)
    if preset is not None:  # the model directory's config, as transformers loads it
        try:
            proof.config_note = verify_config(store, store.dirname(path)).note()
        except CheckpointError as e:
            proof.config_problems.append(e.message)
    return proof
