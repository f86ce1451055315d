"""A library of verified solutions: recurring problems are answered from grafted pages, new ones with
the library as context, and what a verifier accepts is kept (the flywheel).

    lib = Library(lm, store)
    lib.add("What is 12 + 7?", "19", ArithmeticVerifier())   # refused unless the verifier accepts
    r = lib.solve("what is 12 +  7?", ArithmeticVerifier())  # recurring: graft + <= 4 decode tokens
    r = lib.solve("What is 3 + 4?", ArithmeticVerifier())    # new: generate, verify, deposit

    recurring:  entry ──> artifact [chat prompt | solution] ──graft──> cache; solution read from the
                page token ids and verified again; decode <= confirm_tokens to see the end of turn
    new:        entries ──> one chat of earlier verified exchanges, ingested once per library version
                (TieredModel) ──graft──> + new user turn ──generate──> verifier ──accepted──> add()
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from transformers import DynamicCache

from paging import PageStore
from paging.errors import CorruptPageError, PageNotFoundError
from tieredkv.artifacts.artifact import deposit, graft, grafted_token_ids, load_artifact, prefill
from tieredkv.engine.tiered_config import TieredConfig
from tieredkv.errors import ArtifactNotFoundError, EmptyInputError, TieredKVError
from tieredkv.library.entries import LibraryEntry, LibraryIndex, problem_sha256
from tieredkv.library.verifiers import Verdict, as_verifier, verifier_identity
from tieredkv.models.loading import LoadedModel

__all__ = ["Library", "LibraryEntry", "SolveResult", "SolutionRejectedError", "answer_plain", "problem_sha256"]



# NOTE: one page per prefill chunk: a page's bytes then depend only on its tokens and those before it, not
# on where the document ends, so growing library documents never store one key with two byte strings.
LIBRARY_CONFIG = TieredConfig(chunk_pages=1)


class SolutionRejectedError(TieredKVError):
    """`add` was given a solution its verifier rejects: nothing was deposited."""

    def __init__(self, problem: str, verdict: Verdict, verifier: str):
        self.verdict = verdict
        super().__init__(f"verifier {verifier!r} rejects the solution to {problem!r} ({verdict.reason}); nothing "
                         "was deposited. Fix the solution, or check the verifier")


@dataclass
class SolveResult:
    """What `solve` did. Token counts are forwards actually run, not estimates."""

    problem: str
    route: str  # "recurring" (grafted entry) or "generated" (library as context, or the bare model)
    answer: str
    verdict: Verdict
    decode_tokens: int  # single-token forwards that produced a generated token
    prefill_tokens: int  # prompt tokens run through the model in this call (grafted tokens excluded)
    grafted_tokens: int  # tokens whose K/V came from stored pages
    generated_ids: list[int] = field(default_factory=list)
    end_of_turn: bool = False  # the model closed its turn within the decoded tokens
    deposited: bool = False  # a verified generated answer became a new entry
    artifact_id: str | None = None  # the entry's artifact (recurring or newly deposited)

    @property
    def accepted(self) -> bool:
        return self.verdict.accepted

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k != "verdict"}
        return {**d, "verdict": self.verdict.to_dict(), "accepted": self.accepted}


def _until_eos(ids: Sequence[int], eos: int | None) -> tuple[list[int], bool]:
    ids = [int(i) for i in ids]
    if eos is not None and eos in ids:
        return ids[: ids.index(eos)], True
    return ids, False


@torch.inference_mode()
def answer_plain(lm: LoadedModel, problem: str, *, max_new_tokens: int = 32) -> SolveResult:
    """The bare model on the chat-formatted problem (the baseline; also a solve on an empty library).

    The verdict is left unset (accepted=False, reason "not verified"); callers verify.
    """
    ids = lm.codec.chat_prompt(problem)
    cache = DynamicCache(config=lm.model.config)
    prefill(lm, ids[:-1], cache, page_size=lm.default_page_size)  # canonical chunks, as every path here
    eos = lm.codec.eos_token_id
    out = lm.model.generate(torch.tensor([ids], device=lm.model.device), past_key_values=cache,
                            max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=eos)
    new = out[0, len(ids):].tolist()
    answer_ids, eot = _until_eos(new, eos)
    return SolveResult(problem, "generated", lm.codec.decode(answer_ids).strip(), Verdict(False, "not verified"),
                       decode_tokens=len(new), prefill_tokens=len(ids) - 1, grafted_tokens=0,
                       generated_ids=new, end_of_turn=eot)


class Library:
    """Verified solutions of one model, kept in `store` under the name `name`."""

    def __init__(self, lm: LoadedModel, store: PageStore, *, name: str = "default",
                 config: TieredConfig = LIBRARY_CONFIG, max_new_tokens: int = 32, confirm_tokens: int = 4):
        if confirm_tokens < 1 or max_new_tokens < 1:
            raise ValueError("confirm_tokens >= 1 and max_new_tokens >= 1 are required")
        self.lm, self.store, self.config = lm, store, config
        self.index = LibraryIndex(store, name)
        self.max_new_tokens, self.confirm_tokens = max_new_tokens, confirm_tokens

    @property
    def version(self) -> int:
        return self.index.version

    def __len__(self) -> int:
        return len(self.index)

    def get(self, problem: str) -> LibraryEntry | None:
        return self.index.get(problem_sha256(problem))

    def entries(self) -> list[LibraryEntry]:
        return self.index.entries()

    # ------------------------------------------------------------------ add
    def add(self, problem: str, solution: str, verifier, *, source: str = "add") -> LibraryEntry:
        """Deposit `solution` if `verifier` accepts it; raise SolutionRejectedError (storing nothing) if not."""
        if not problem.strip() or not solution.strip():
            raise EmptyInputError("the problem and the solution must be non-empty")
        v = as_verifier(verifier)
        identity = verifier_identity(v)  # before any work: an unattributable verifier is refused
        verdict = v.check(problem, solution)
        if not verdict.accepted:
            raise SolutionRejectedError(problem, verdict, v.name)
        key = problem_sha256(problem)
        existing = self.index.get(key)
        if existing is not None and existing.solution == solution and existing.verifier == identity:
            return existing
        art, num_prompt = self._deposit(problem_text=problem, solution=solution)
        entry = LibraryEntry(problem, key, solution, art.artifact_id, num_prompt, verdict.to_dict(), identity,
                             self.lm.fingerprint, source)
        self.index.put(entry)
        return entry

    def _deposit(self, *, problem_text: str, solution: str):
        """The artifact of one entry: chat-formatted problem, then the solution. Returns (artifact, prompt tokens)."""
        prompt = self.lm.codec.chat_prompt(problem_text)
        ids = prompt + self.lm.codec.encode(solution)
        name = f"{self.index.namespace}{problem_sha256(problem_text)[:16]}"
        return deposit(self.lm, ids, self.store, name=name), len(prompt)

    # ------------------------------------------------------------------ solve
    def solve(self, problem: str, verifier, *, deposit: bool = True) -> SolveResult:
        """Recurring problem: the stored, re-verified solution in <= `confirm_tokens` decode tokens.
        Otherwise generate with the library as context, verify, and (if `deposit`) keep what passes."""
        if not problem.strip():
            raise EmptyInputError("the problem is empty")
        v = as_verifier(verifier)
        if deposit:
            verifier_identity(v)  # fail before generating, not after, if verdicts could not be attributed
        entry = self.get(problem)
        if entry is not None:
            result = self._recall(problem, entry, v)
            if result is not None:
                return result
        result = self._generate(problem) if len(self) else answer_plain(self.lm, problem,
                                                                        max_new_tokens=self.max_new_tokens)
        result.verdict = v.check(problem, result.answer) if result.answer else Verdict(False, "empty answer")
        if result.accepted and deposit:
            result.artifact_id = self.add(problem, result.answer, v, source="solve").artifact_id
            result.deposited = True
        return result

    @torch.inference_mode()
    def _recall(self, problem: str, entry: LibraryEntry, v) -> SolveResult | None:
        """Graft the entry's artifact, read the solution from the pages' token ids, verify it again, and
        decode a few tokens to see the model close its turn. None if the stored solution no longer passes."""
        try:
            art = load_artifact(self.store, entry.artifact_id)
            ids = grafted_token_ids(self.store, art)  # BLAKE3-verified pages
        except (ArtifactNotFoundError, PageNotFoundError, CorruptPageError):
            # NOTE: bad or missing bytes are a miss, never served: recompute the pages from the entry's
            # verified text (corrupt pages were quarantined by the store), then read them back.
            art = self._deposit(problem_text=entry.problem, solution=entry.solution)[0]
            ids = grafted_token_ids(self.store, art)
        answer = self.lm.codec.decode(ids[entry.prompt_tokens:]).strip()
        verdict = v.check(problem, answer)
        if not verdict.accepted:
            return None
        cache = graft(self.lm, art, self.store)
        cache.crop(-1)  # the last token is fed again: its logits give the first decoded token
        eos = self.lm.codec.eos_token_id
        out = self.lm.model.generate(torch.tensor([ids], device=self.lm.model.device), past_key_values=cache,
                                     max_new_tokens=self.confirm_tokens, do_sample=False, eos_token_id=eos,
                                     pad_token_id=eos)
        new = out[0, len(ids):].tolist()
        _, eot = _until_eos(new, eos)
        return SolveResult(problem, "recurring", answer, verdict, decode_tokens=len(new), prefill_tokens=0,
                           grafted_tokens=len(ids) - 1, generated_ids=new, end_of_turn=eot,
                           artifact_id=art.artifact_id)

    def prepare_context(self) -> int:
        """Ingest the library document now if this version has not been (else a cheap graft); returns the
        tokens ingested. `solve` does this itself on a new problem; call it to keep that cost apart."""
        from tieredkv.engine.tiered_model import TieredModel

        if not len(self):
            return 0
        tm = TieredModel(self.lm, self.store, self.config)
        try:
            return self._graft_context(tm)
        finally:
            tm.reset()
            tm.close()

    def _generate(self, problem: str) -> SolveResult:
        from tieredkv.engine.tiered_model import TieredModel

        # NOTE: TieredModel swaps the model's attention function until close(); it lives only for this
        # call so that grafts and deposits elsewhere see (and record) the model's own attention.
        tm = TieredModel(self.lm, self.store, self.config)
        try:
            num_ingested = self._graft_context(tm)
            q_ids = self.lm.codec.encode(problem + self._transcript()[1])
            grafted = tm.num_tokens
            new = tm.generate(q_ids, max_new_tokens=self.max_new_tokens, eos_token_id=self.lm.codec.eos_token_id)
        finally:
            tm.reset()  # drop the question's K/V: only the library document is kept as pages
            tm.close()
        answer_ids, eot = _until_eos(new, self.lm.codec.eos_token_id)
        return SolveResult(problem, "generated", self.lm.codec.decode(answer_ids).strip(), Verdict(False, ""),
                           decode_tokens=len(new), prefill_tokens=num_ingested + len(q_ids) - 1,
                           grafted_tokens=grafted, generated_ids=new, end_of_turn=eot)

    # ------------------------------------------------------------------ the library as context
    def _transcript(self) -> tuple[str, str]:
        """(document, turn end): every verified entry as an earlier exchange of one chat, the document ending
        where the next user message begins; a new problem is `problem + turn end`. Without a chat template:
        `Q: problem\nA: solution` lines."""
        turns = [(e.problem, e.solution) for e in self.entries()]
        tok = getattr(self.lm.codec, "tokenizer", None)
        if tok is not None and getattr(tok, "chat_template", None):
            marker = "\u2063PROBLEM\u2063"
            messages = [m for p, s in turns for m in ({"role": "user", "content": p},
                                                      {"role": "assistant", "content": s})]
            full = tok.apply_chat_template(messages + [{"role": "user", "content": marker}],
                                           add_generation_prompt=True, tokenize=False)
            doc, end = full.split(marker)
            return doc, end
        return "".join(f"Q: {p}\nA: {s}\n" for p, s in turns) + "Q: ", "\nA:"

    def context_document(self) -> str:
        """The text ingested as the library's context (the chat so far, up to a new user message)."""
        return self._transcript()[0]

    def _graft_context(self, tm) -> int:
        """Graft the library document into `tm`, ingesting it first if this library version has not been;
        returns the number of tokens ingested (0 when grafted from the store)."""
        version, regime = self.version, tm.regime_fp
        ctx = self.index.context()
        if ctx is not None and ctx["version"] == version and ctx["regime"] == regime and self._is_stored(ctx):
            tm.graft(ctx["artifact"])
            return 0
        if ctx is not None:
            # NOTE: dropped before ingesting the new document, not after: with chunk_pages > 1 a page's bytes
            # depend on how long its prefill chunk was, so the old document's last pages and the new one's
            # same-key pages can differ, and the store refuses same key, other bytes (PageConflictError).
            self._drop_context(ctx["artifact"])
        ids = self.lm.codec.encode(self.context_document())
        art = tm.ingest(ids, name=f"{self.index.namespace}context:v{version}")
        self.index.set_context(version, art.artifact_id, regime)
        tm.graft(art)  # the same path as a later call: answers do not depend on who ingested
        return len(ids)

    def _is_stored(self, ctx: dict[str, Any]) -> bool:
        try:
            art = load_artifact(self.store, ctx["artifact"])
        except ArtifactNotFoundError:
            return False
        return all(self.store.contains(k) for k in art.page_keys)  # pages stream in lazily: check up front

    def _drop_context(self, artifact_id: str) -> None:
        """Remove a superseded library document: its manifest and its pages (the library's own chain)."""
        try:
            old = load_artifact(self.store, artifact_id)
        except ArtifactNotFoundError:
            return
        self.store.delete_manifest(old.artifact_id)
        for key in old.page_keys:
            self.store.remove(key)
