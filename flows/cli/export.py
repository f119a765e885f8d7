"""``sailor export JOB --out DIR``: a job's trained model as a Hugging Face folder.

Writes the job's latest valid checkpoint as ``config.json`` + ``model.safetensors``, which
``transformers.AutoModelForCausalLM.from_pretrained(DIR)`` loads (``sailor_core/runtime/hf.py``;
transformers itself is not needed).  ``--checkpoint URL`` exports a checkpoint folder instead of a
job's (e.g. one of ``sailor engine run --ckpt-dir``).
"""

from __future__ import annotations

from typing import Optional

import typer

from flows.cli.common import console, print_json
from sailor_core.errors import InputError


def export_cmd(
    job_id: Optional[str] = typer.Argument(None, help="job id (see `sailor jobs`)"),
    out: str = typer.Option(..., "--out", help="folder to write config.json and model.safetensors into"),
    checkpoint: Optional[str] = typer.Option(None, "--checkpoint",
                                             help="a checkpoint URL (path, s3://, gs://) instead of a job's"),
    dtype: str = typer.Option("float32", "--dtype", help="float32, bfloat16 or float16"),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer",
                                            help="a folder (path, s3://, gs://) whose tokenizer files to copy; "
                                                 "default: the job's --tokenizer, else the one its --data was prepared with (its "
                                                 "manifest), else the pretrained folder's or the model folder's"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """Write a job's trained model as a Hugging Face model folder."""
    if (job_id is None) == (checkpoint is None):
        raise InputError("give a job id or --checkpoint URL (one of them)")
    if checkpoint is None:
        # lazy: loaded when the command runs (the CLI starts light)
        from sailor_core.job.state import JobStore

        job = JobStore().load(job_id).spec
        from sailor_core.runtime.token_manifest import tokenizer_folder  # lazy: as above

        data_tokenizer = tokenizer_folder(job.dataset) if job.dataset != "synthetic" else None
        checkpoint, tokenizer = job.checkpoint_url, tokenizer or job.tokenizer or data_tokenizer or None
        if not checkpoint:
            raise InputError(f"job {job_id!r} has no checkpoint URL")
    from infra.config import use_embedded_storage  # lazy: as above
    from sailor_core.runtime.hf import export_checkpoint  # lazy: torch, only for this command

    use_embedded_storage()  # a job's checkpoints in the embedded cloud's buckets, from any shell

    done = export_checkpoint(checkpoint, out, dtype=dtype, tokenizer_from=tokenizer)
    row = {"out": str(done.out_dir), "model": done.model, "step": done.step, "num_parameters": done.num_parameters,
           "dtype": done.dtype, "checkpoint": checkpoint, "config_from": done.config_from,
           "tokenizer_from": done.tokenizer_from}
    if as_json:
        print_json(row)
        return
    console().print(f"wrote {done.model} at step {done.step} ({done.num_parameters:,} parameters, {done.dtype}) "
                    f"to {done.out_dir}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("export")(export_cmd)
