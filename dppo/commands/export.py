"""`dppo export`: a checkpoint's deterministic policy (:mod:`dppo.rl.deterministic`) as ONNX (onnxruntime) or
TorchScript, with a dynamic batch dimension, written atomically."""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from dppo.cli_args import existing_checkpoint, fail, import_from_cwd
from dppo.errors import UsageError, first_line
from dppo.run.run_dir import new_temp_file

if TYPE_CHECKING:
    from dppo.rl.deterministic import DeterministicPolicy

FORMATS = ("onnx", "torchscript")


def export(policy: DeterministicPolicy, output: Path, fmt: str) -> None:
    """Write the graph atomically (a temp file in the target directory, then a rename)."""
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
    import torch

    from dppo.rl.deterministic import example_inputs

    policy.requires_grad_(False)
    inputs = example_inputs(policy)
    output = check_output(output)
    try:
        tmp = new_temp_file(output)  # mode 0o666 less the umask, as open() gives: the policy ships to others
    except OSError as err:
        raise UsageError(f"cannot write {str(output)!r}: {err.strerror}; pick a writable -o path") from None
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # chatter about optional torchvision ops
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if fmt == "torchscript":
                torch.jit.trace(policy, inputs, check_trace=False).save(str(tmp))
            else:
                batch = torch.export.Dim("batch")
                names = policy.input_names()
                with contextlib.redirect_stdout(io.StringIO()):
                    torch.onnx.export(policy, inputs, str(tmp), input_names=names, output_names=policy.output_names(),
                                      dynamic_shapes={"inputs": tuple({0: batch} for _ in names)}, dynamo=True,
                                      external_data=False)
        os.replace(tmp, output)
    except Exception as err:
        own = getattr(policy.model, "entry_point", None)  # a network of one's own (dppo.rl.custom)
        if own is None or isinstance(err, UsageError):
            raise
        other = "torchscript (-o policy.pt)" if fmt == "onnx" else "onnx (-o policy.onnx)"
        why = first_line(err).split(" Next steps")[0]  # torch.onnx's first line ends by announcing more lines
        raise UsageError(f"model.entry_point {own!r} does not export as {fmt}: {type(err).__name__}: "
                         f"{why}; make its forward traceable (tensor ops only, no Python control flow on "
                         f"values) or try --format {other}") from None
    finally:
        tmp.unlink(missing_ok=True)


def check_output(output: Path) -> Path:
    """``output`` resolved, once it names a file in a directory that exists."""
    output = output.resolve()
    if not output.parent.is_dir():
        raise UsageError(f"cannot write {str(output)!r}: directory {str(output.parent)!r} does not exist")
    if output.is_dir():
        raise UsageError(f"cannot write {str(output)!r}: it is a directory; pass a file name such as policy.onnx")
    return output


SUFFIXES = {".onnx": "onnx", ".pt": "torchscript", ".ts": "torchscript", ".torchscript": "torchscript"}


def format_for(output: Path, fmt: str | None) -> str:
    """--format, else from the file name (:data:`SUFFIXES`); a name that says neither is bad input, never a guess:
    ``policy.xyz`` written as ONNX would be found by nobody who looks for it."""
    if fmt is not None:
        return fmt
    found = SUFFIXES.get(output.suffix.lower())
    if found is None:
        named = f"ends in {output.suffix!r}" if output.suffix else "has no suffix"
        raise UsageError(f"-o {str(output)!r} {named}, which names no export format; name the file .onnx (ONNX) or .pt "
                         "(TorchScript), or pass --format onnx|torchscript")
    return found


def register(sub: argparse._SubParsersAction) -> None:
    ex = sub.add_parser("export", help="export the deterministic policy for deployment (ONNX or TorchScript)",
                        description="The checkpoint's deterministic policy, observation normalization included: "
                        "raw observation in, env action out, dynamic batch dimension.")
    ex.add_argument("--checkpoint", required=True, help="a ckpt-*.pt file or a run directory")
    ex.add_argument("-o", "--output", required=True, type=Path, help="file to write, e.g. policy.onnx")
    ex.add_argument("--best", action="store_true",
                    help="the run's best evaluated weights (checkpoints/best.pt, run.eval_every) instead of the latest")
    ex.add_argument("--format", choices=FORMATS,
                    help="default: from the file name (.onnx: onnx; .pt or .ts: torchscript)")
    ex.add_argument("--policy", help="a run of several policies (policies:): export this one to -o; default: every "
                    "policy, each to the -o name with .POLICY before its suffix (policy.adversary.onnx)")
    ex.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    check_output(args.output)  # what -o names is bad input before the checkpoint is read
    fmt = format_for(args.output, args.format)
    existing_checkpoint(args.checkpoint)
    from dppo.run.checkpoint import load

    checkpoint = load(args.checkpoint, best=args.best)
    import_from_cwd()
    if fmt == "onnx":
        try:
            import onnx  # noqa: F401 - torch's exporter needs onnx and onnxscript
            import onnxscript  # noqa: F401
        except ImportError as err:
            fail(f"dppo export needs {err.name}: pip install 'dppo[export]'")
    from dppo.rl.deterministic import DeterministicPolicy
    from dppo.run.trained import trained_model, trained_policies

    several = checkpoint.get("policies") is not None
    if args.policy is not None and not several:
        fail("--policy picks one of a run's several policies, and this checkpoint holds one policy; leave --policy "
             "out")
    if several and args.policy is None:
        outputs = {name: policy_output(args.output, name) for name in checkpoint["policies"]}
        trained = trained_policies(checkpoint)
    else:
        outputs = {args.policy: args.output}
        trained = {args.policy: trained_model(checkpoint, policy=args.policy)}
    for name, output in outputs.items():
        part = trained[name]
        policy = DeterministicPolicy(part.model, part.obs_stats, part.config.env.obs_clip)
        export(policy, output, fmt)
        which = f"policy {name}; " if several else ""
        print(f"wrote {output} ({fmt}; {which}env {part.config.env.name}; inputs {', '.join(policy.input_names())}; "
              f"outputs {', '.join(policy.output_names())})")
    return 0


def policy_output(output: Path, policy: str) -> Path:
    """Where one policy of several goes: ``policy.onnx`` -> ``policy.adversary.onnx``."""
    return output.with_name(f"{output.stem}.{policy}{output.suffix}")
