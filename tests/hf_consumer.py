"""transformers (PyTorch, CPU) as the consumer of an exported model directory.

Run as a script in a process of its own (``python hf_consumer.py OUT_DIR CLASS INPUTS
RESULT``): loads ``OUT_DIR`` with ``transformers.CLASS.from_pretrained(...,
output_loading_info=True)``, runs it in eval mode on the arrays of ``INPUTS`` (an npz
of input_ids, token_type_ids, attention_mask; missing ones left out) and writes to
``RESULT`` (npz) every float tensor of the output and, as ``loading_info``, the JSON of
the missing, unexpected and mismatched keys.
"""

from __future__ import annotations

import json
import sys

import numpy as np


def main(out_dir: str, cls: str, inputs: str, result: str) -> None:
    import torch
    import transformers

    model, info = getattr(transformers, cls).from_pretrained(out_dir, output_loading_info=True)
    model.eval()
    given = dict(np.load(inputs))
    with torch.no_grad():
        out = model(**{k: torch.from_numpy(v) for k, v in given.items()})
    arrays = {
        k: v.numpy()
        for k, v in out.items()
        if isinstance(v, torch.Tensor) and v.is_floating_point()
    }
    loading = {
        k: sorted(map(str, info[k])) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")
    }
    loading["config"] = model.config.to_dict()["architectures"]
    np.savez(result, loading_info=np.array(json.dumps(loading)), **arrays)


if __name__ == "__main__":
    main(*sys.argv[1:5])
