"""The standard zero-shot tasks (and WikiText-2) from the dataset hub, converted to linlm's task files (:mod:`linlm.eval.tasks`).

Each task is read with ``datasets.load_dataset`` from the dataset, configuration and split that
lm-evaluation-harness uses for it (its task YAML: ``dataset_path``, ``dataset_name``, and the test split when the
task has one, else the validation split), and each row becomes the record whose requests are lm-eval's for that
document: its preprocessing (HellaSwag's ``process_docs``), its ``doc_to_text``, ``doc_to_choice`` and
``doc_to_target``, and its ``target_delimiter`` " ", written into each record as ``delimiter``.

:func:`task_dir` is where ``linlm eval`` reads its tasks: ``--data-dir`` when given, else the cache
(``cache_dir() / "tasks" / FORMAT``, see :func:`linlm.data.corpus.cache_dir`), which gets each missing task from
the hub on first use. :func:`fetch` writes the same files into a directory of your choice, for a machine without
network. Offline (``HF_DATASETS_OFFLINE`` or ``HF_HUB_OFFLINE`` set, or the hub unreachable) with a task not
cached is a one-line DataError that names both ways out. Every file goes through :mod:`linlm.outputs`.

A ``loader(task) -> rows`` replaces the hub (tests use :func:`files_loader` on local Parquet / JSON Lines files in
the hub's formats).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional, Sequence

from linlm.errors import DataError
from linlm.eval.tasks import TASKS, resolve_tasks, validate_record
from linlm.data.hub_probe import OFFLINE_ENV, hub_unreachable, offline  # noqa: F401 (OFFLINE_ENV: the tests read it here)

# The conversion's version: the cache keeps each version apart, so a changed conversion never reads old files.
FORMAT = "lm-eval-v1"
DELIMITER = " "  # lm-eval's default target_delimiter


@dataclass(frozen=True)
class HubTask:
    """Where lm-evaluation-harness reads a task (``load_dataset(path, name, split=split)``) and how one of its rows
    becomes a linlm record."""

    path: str
    name: Optional[str]
    split: str
    convert: Callable[[dict], dict]

    def label(self) -> str:
        return f"{self.path}{'/' + self.name if self.name else ''} ({self.split})"


# ---- lm-eval's task definitions, row by row -------------------------------------------------------------------

def _choice(query: str, choices: Sequence[str], gold: int) -> dict:
    return {"query": query, "choices": list(choices), "gold": int(gold), "delimiter": DELIMITER}


def _piqa(row: dict) -> dict:
    return _choice(f"Question: {row['goal']}\nAnswer:", [row["sol1"], row["sol2"]], row["label"])


def _hellaswag_clean(text: str) -> str:
    """lm-eval's HellaSwag ``preprocess``: strip, " [title]" to ". ", drop the WikiHow [bracketed] markers, then
    one pass turning double spaces into single ones."""
    text = text.strip().replace(" [title]", ". ")
    return re.sub(r"\[.*?\]", "", text).replace("  ", " ")


def _hellaswag(row: dict) -> dict:
    context = row["ctx_a"] + " " + row["ctx_b"].capitalize()
    return _choice(_hellaswag_clean(row["activity_label"] + ": " + context),
                   [_hellaswag_clean(e) for e in row["endings"]], int(row["label"]))


def _arc(row: dict) -> dict:
    choices = row["choices"]
    return _choice(f"Question: {row['question']}\nAnswer:", choices["text"], choices["label"].index(row["answerKey"]))


def _openbookqa(row: dict) -> dict:
    choices = row["choices"]
    return _choice(row["question_stem"], choices["text"], choices["label"].index(row["answerKey"].lstrip()))


def _boolq(row: dict) -> dict:
    return _choice(f"{row['passage']}\nQuestion: {row['question']}?\nAnswer:", ["no", "yes"], row["label"])


def _winogrande(row: dict) -> dict:
    sentence = row["sentence"]
    blank = sentence.index("_")
    return {"context_options": [sentence[:blank] + row["option1"], sentence[:blank] + row["option2"]],
            "continuation": sentence[blank + 1:].strip(), "gold": {"1": 0, "2": 1}[row["answer"]],
            "delimiter": DELIMITER}


def _lambada(row: dict) -> dict:
    words = row["text"].split(" ")
    # lm-eval's target is " " + the last word and its loglikelihood requests add no delimiter: the same text.
    return {"context": " ".join(words[:-1]), "continuation": words[-1], "delimiter": DELIMITER}


def _pair_rule(opening: str, closing: str) -> tuple:
    """Whitespace just inside a bracket or quote pair removed: "( a b )" -> "(a b)" (shortest pair first)."""
    o, c = re.escape(opening), re.escape(closing)
    return re.compile(o + r"\s*([^" + c + r"]*?)\s*" + c), opening + r"\1" + closing


# WikiText's tokenized text back to plain text, lm-eval's ``wikitext_detokenizer``, rule by rule and in its order
# (each a literal replacement, or a compiled pattern and its template). The second rule is lm-eval's as written:
# it matches the literal text "/' 5/" (digits only), not a quote before a digit.
_WIKITEXT_RULES: tuple = (
    ("s '", "s'"), (re.compile(r"/' [0-9]/"), r"/'[0-9]/"),
    (" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."),
    *((f" {p} ", f"{p} ") for p in ":;.!?,"),
    *(_pair_rule(a, b) for a, b in ("()", "[]", "{}", '""', "''")),
    ("= = = =", "===="), ("= = =", "==="), ("= =", "=="), (" \u00b0 ", "\u00b0"),
    (" \n", "\n"), ("\n ", "\n"), (" N ", " 1 "), (" 's", "'s"),
)


def wikitext_detokenize(page: str) -> str:
    """A WikiText page with its tokenization undone as lm-eval's ``wikitext`` task does before scoring it."""
    for old, new in _WIKITEXT_RULES:
        page = old.sub(new, page) if isinstance(old, re.Pattern) else page.replace(old, new)
    return page


def _wikitext(row: dict) -> dict:
    # The scored text is the detokenized page; lm-eval counts words and bytes on the page as stored.
    return {"text": wikitext_detokenize(row["page"]), "page": row["page"]}


# lm-evaluation-harness 0.4's task YAMLs (tests/eval/test_hub.py reads the installed ones and compares).
HUB: dict[str, HubTask] = {
    "piqa": HubTask("baber/piqa", None, "validation", _piqa),
    "hellaswag": HubTask("Rowan/hellaswag", None, "validation", _hellaswag),
    "arc_easy": HubTask("allenai/ai2_arc", "ARC-Easy", "test", _arc),
    "arc_challenge": HubTask("allenai/ai2_arc", "ARC-Challenge", "test", _arc),
    "openbookqa": HubTask("allenai/openbookqa", "main", "test", _openbookqa),
    "boolq": HubTask("aps/super_glue", "boolq", "validation", _boolq),
    "winogrande": HubTask("allenai/winogrande", "winogrande_xl", "validation", _winogrande),
    "lambada": HubTask("EleutherAI/lambada_openai", "default", "test", _lambada),
    "wikitext2": HubTask("EleutherAI/wikitext_document_level", "wikitext-2-raw-v1", "test", _wikitext),
}


# ---- loading ----------------------------------------------------------------------------------------------------

Loader = Callable[[HubTask], Iterable[Mapping]]


def way_out(names: Sequence[str]) -> str:
    """What ``linlm eval`` says to do when tasks cannot be had here."""
    return (f"pass --data-dir DIR with the task files, or run `linlm eval fetch --tasks {','.join(names)} --out DIR` "
            "on a machine with network and pass --data-dir DIR")


def fetch_way_out(names: Sequence[str]) -> str:
    """What ``linlm eval fetch`` says to do when tasks cannot be had here."""
    return (f"run `linlm eval fetch --tasks {','.join(names)} --out DIR` where the dataset hub can be reached (none "
            f"of {', '.join(OFFLINE_ENV)} set) and copy DIR here")


def _datasets():
    try:
        import datasets
    except ImportError:
        raise DataError("the standard tasks are read with the optional `datasets` package: pip install "
                        "'linlm[eval]' (or pass --data-dir DIR with the task files)") from None
    return datasets


def hub_loader(task: HubTask) -> Iterable[Mapping]:
    """The task's rows from the dataset hub (``datasets.load_dataset``). Offline, the hub is not asked
    (ConnectionError at once, where datasets would retry)."""
    if offline():
        raise ConnectionError(f"offline ({' or '.join(OFFLINE_ENV)} is set)")
    unreachable = hub_unreachable()
    if unreachable:  # at once, where datasets would retry for half a minute
        raise ConnectionError(unreachable)
    return _datasets().load_dataset(task.path, task.name, split=task.split)


def files_loader(files: Mapping[str, str | Path], cache_dir: Optional[str | Path] = None) -> Loader:
    """A loader reading local copies in the hub's formats, ``{task name: file}``: Parquet by the suffix
    ``.parquet``, else JSON Lines (``datasets.load_dataset("parquet" | "json", data_files=...)``; ``cache_dir``
    for datasets' own cache)."""
    by_source = {(HUB[name].path, HUB[name].name): Path(path) for name, path in files.items()}

    def load(task: HubTask) -> Iterable[Mapping]:
        path = by_source.get((task.path, task.name))
        if path is None:
            raise FileNotFoundError(f"no local file for {task.label()}")
        kind = "parquet" if path.suffix == ".parquet" else "json"
        return _datasets().load_dataset(kind, data_files=str(path), split="train", cache_dir=cache_dir)

    return load


def convert(name: str, rows: Iterable[Mapping]) -> list[dict]:
    """Hub rows -> linlm records of task ``name``, each checked as ``linlm eval`` checks its files."""
    task, kind = HUB[name], TASKS[name].kind
    out = []
    for i, row in enumerate(rows, 1):
        try:
            rec = task.convert(dict(row))
            validate_record(kind, rec)
        except (KeyError, ValueError, TypeError, AttributeError) as e:
            raise DataError(f"{name}: row {i} of {task.label()} does not convert ({type(e).__name__}: {e}); "
                            f"its fields are {sorted(row)}") from None
        out.append(rec)
    if not out:
        raise DataError(f"{name}: {task.label()} holds no rows")
    return out


def load_records(name: str, loader: Optional[Loader] = None, hint: Callable[[Sequence[str]], str] = way_out
                 ) -> list[dict]:
    """Task ``name`` from the hub (or ``loader``), converted. Not reachable or not readable: a one-line DataError
    ending in ``hint([name])``, the ways out."""
    from linlm.data.sources import first_line, hf_read_errors

    try:
        import datasets

        unreadable = hf_read_errors(datasets)
    except ImportError:
        unreadable = ()
    task = HUB[name]
    try:
        return convert(name, (loader or hub_loader)(task))
    except DataError:
        raise
    except (ConnectionError, TimeoutError) as e:
        why = f"the dataset hub is not reachable ({first_line(e)})"
    except (OSError, ValueError, *unreadable) as e:
        why = f"loading it failed ({type(e).__name__}: {first_line(e)})"
    raise DataError(f"{name}: not cached and {task.label()} could not be read: {why}; {hint([name])}")


# ---- files ------------------------------------------------------------------------------------------------------

def cache_root() -> Path:
    from linlm.data.corpus import cache_dir

    return cache_dir() / "tasks" / FORMAT


def _jsonl(records: list[dict]) -> str:
    from linlm.outputs import dumps

    return "".join(dumps(r, indent=None) for r in records)


def _write(names: Sequence[str], root: Path, what: str, loader: Optional[Loader],
           progress: Optional[Callable[[str, Path, int], None]], hint: Callable[[Sequence[str]], str]
           ) -> dict[str, Path]:
    """Write each task's file into ``root``: a copy of the cached one when there is one, else from the hub (or
    ``loader``). Offline with a task to get from the hub: one line, nothing written."""
    from linlm import outputs

    cache = cache_root()
    cached = {n: cache / TASKS[n].filename for n in names}
    cached = {n: f for n, f in cached.items() if f.is_file() and f != root / TASKS[n].filename}
    from_hub = [n for n in names if n not in cached]
    if from_hub and loader is None and offline():
        raise DataError(f"{', '.join(from_hub)}: not in the task cache {cache} and offline ({' or '.join(OFFLINE_ENV)} "
                        f"is set); {hint(from_hub)}")
    out = {}
    for name in names:
        text = cached[name].read_text(encoding="utf-8") if name in cached else _jsonl(load_records(name, loader, hint))
        out[name] = outputs.write_text(root / TASKS[name].filename, text, what)
        if progress is not None:
            progress(name, out[name], text.count("\n"))
    return out


def fetch(tasks: str | Sequence[str], out: str | Path, *, loader: Optional[Loader] = None,
          progress: Optional[Callable[[str, Path, int], None]] = None) -> dict[str, Path]:
    """Write the task files of ``tasks`` into directory ``out`` (checked first: new, empty, or linlm's) for
    ``linlm eval --data-dir out``; {task: file}. ``progress(task, file, documents)`` after each."""
    from linlm import outputs

    names = resolve_tasks(tasks)
    root = outputs.check_dir(out, "--out", names=[TASKS[n].filename for n in names])
    return _write(names, root, "--out", loader, progress, fetch_way_out)


def task_dir(tasks: str | Sequence[str], data_dir: Optional[str | Path] = None, *,
             loader: Optional[Loader] = None, progress: Optional[Callable[[str, Path, int], None]] = None) -> Path:
    """The directory ``linlm eval`` reads ``tasks`` from: ``data_dir`` when given (it must be a directory), else
    the cache, where each task not there yet is fetched first (``progress`` as in :func:`fetch`)."""
    from linlm.eval.evaluator import check_data_dir

    if data_dir:
        return check_data_dir(data_dir)
    root = cache_root()
    missing = [n for n in resolve_tasks(tasks) if not (root / TASKS[n].filename).is_file()]
    if missing:
        _write(missing, root, "task cache", loader, progress, way_out)
    return root
