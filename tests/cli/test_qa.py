"""`tieredkv qa` runs the library's open/ask: several questions with one model load and one open, questions
from a file, the document from stdin, JSONL out; $TIEREDKV_MODEL and $TIEREDKV_STORE as defaults."""
from __future__ import annotations

import io
import json

import pytest

from tieredkv.cli import main

DOC = "Alpha. " * 60 + "The secret colour is teal. " + "Beta. " * 60


def _jsonl(capsys) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]


def test_several_questions_share_one_load_and_one_open(tmp_path, capsys, monkeypatch):
    """--question twice and --questions FILE (plain lines and JSONL): one answer line each, all with the
    same model load and the same open; a second run grafts."""
    doc = tmp_path / "doc.txt"
    doc.write_text(DOC)
    questions = tmp_path / "q.txt"
    questions.write_text('What colour?\n\n{"question": "Which word comes first?", "id": 7}\n')
    loads = []
    import tieredkv.models.loading as loading

    real = loading.load_model
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: loads.append(a) or real(*a, **k))
    args = ["qa", "--model", "tiny-llama", "--doc", str(doc), "--store", str(tmp_path / "s"), "--question", "One?",
            "--question", "Two?", "--questions", str(questions), "--max-new-tokens", "2", "--json", "--quiet"]
    assert main(args) == 0
    first = _jsonl(capsys)
    assert [a["question"] for a in first] == ["One?", "Two?", "What colour?", "Which word comes first?"]
    assert len(loads) == 1 and len({a["timings"]["load_s"] for a in first}) == 1
    assert {a["context"] for a in first} == {"ingested"} and len({a["timings"]["open_s"] for a in first}) == 1
    assert first[0]["timings"]["attach_s"] == 0.0 and all(a["timings"]["attach_s"] > 0 for a in first[1:])
    assert main(args) == 0
    second = _jsonl(capsys)
    assert {a["context"] for a in second} == {"grafted"} and [a["answer"] for a in second] == \
        [a["answer"] for a in first]


def test_the_document_comes_from_stdin_and_defaults_from_the_environment(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(DOC))
    monkeypatch.setenv("TIEREDKV_MODEL", "tiny-llama")
    monkeypatch.setenv("TIEREDKV_STORE", str(tmp_path / "env"))
    assert main(["qa", "--doc", "-", "--question", "What colour?", "--max-new-tokens", "2", "--json", "--quiet"]) == 0
    (ans,) = _jsonl(capsys)
    assert ans["store"] == str(tmp_path / "env") and ans["document"] == "stdin" and ans["context"] == "ingested"
    assert (tmp_path / "env" / "data.mdb").is_file()


@pytest.mark.parametrize("line", ['{"q": "no question field"}', '{"question": 3}', '{"question": "unclosed"'])
def test_a_questions_file_line_that_is_not_a_question_is_one_line(tmp_path, capsys, line):
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"question": "fine"}\n' + line + "\n")
    code = main(["qa", "--model", "tiny-llama", "--doc", str(tmp_path / "q.jsonl"), "--questions", str(questions),
                 "--store", str(tmp_path / "s")])
    err = capsys.readouterr().err
    assert code == 2 and "line 2" in err and "JSONL" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("selection", ["lexical", "question"])
def test_a_question_time_selection_needs_the_reading_off_and_then_answers(tmp_path, capsys, selection):
    doc = tmp_path / "doc.txt"
    doc.write_text(DOC * 3)
    base = ["qa", "--model", "tiny-llama", "--doc", str(doc), "--store", str(tmp_path / "s"), "--question",
            "What is the secret colour?", "--max-new-tokens", "2", "--json", "--quiet", "--select", selection]
    assert main(base) != 0
    assert "--read-passages 0" in capsys.readouterr().err
    small = ["--read-passages", "0", "--position", "own", "--page-size", "32", "--local-pages", "2",
             "--topk-pages", "2"]
    assert main([*base, *small]) == 0
    [answer] = _jsonl(capsys)
    assert answer["question"] == "What is the secret colour?" and answer["context"] == "ingested"


def test_read_run_pages_flag(tmp_path, capsys):
    doc = tmp_path / "doc.txt"
    doc.write_text(DOC * 40)
    base = ["qa", "--model", "tiny-llama", "--doc", str(doc), "--store", str(tmp_path / "s"), "--question",
            "What is the secret colour?", "--max-new-tokens", "2", "--json", "--quiet", "--page-size", "32"]
    assert main([*base, "--read-run-pages", "0"]) == 2
    assert "--read-run-pages" in capsys.readouterr().err
    assert main([*base, "--read-run-pages", "1"]) == 0
    [answer] = _jsonl(capsys)
    assert answer["question"] == "What is the secret colour?"


def test_read_second_at_flag(tmp_path, capsys):
    """A document that repeats itself: the question's words meet equally well in every copy, so by default a
    second place is read (as with any small share); `--read-second-at 0` reads one; a share outside (0, 1] is
    a one-line usage error."""
    doc = tmp_path / "doc.txt"
    doc.write_text(DOC * 40)
    base = ["qa", "--model", "tiny-llama", "--doc", str(doc), "--store", str(tmp_path / "s"), "--question",
            "What is the secret colour?", "--max-new-tokens", "2", "--json", "--quiet", "--page-size", "32"]
    for bad in ("1.5", "-0.2", "nan", "x"):
        assert main([*base, "--read-second-at", bad]) == 2
        err = capsys.readouterr().err
        assert "--read-second-at" in err and "(0, 1]" in err and len(err.strip().splitlines()) == 1
    passages = {}
    for share in (None, "0", "0.01"):
        assert main([*base, *(["--read-second-at", share] if share else [])]) == 0
        [answer] = _jsonl(capsys)
        passages[share] = answer["passages"]
    assert len(passages[None]) == 2 and len(passages["0"]) == 1 and passages["0.01"] == passages[None]
    assert passages["0"][0] in passages[None]
