"""`deposit()` checks what it is given as the CLI and `TieredModel.ingest` do: token ids, page size, name; a
closed store and a bytes path are typed errors. Nothing is written or bound by a refused deposit."""
from __future__ import annotations

import numpy as np
import pytest

from paging import PageStore, StoreConfig
from paging.errors import PagingError, StoreClosedError
from tieredkv.artifacts.artifact import deposit, store_fingerprint
from tieredkv.errors import EmptyInputError, TokenIdsError


@pytest.fixture
def lm(tiny_model):
    return tiny_model("tiny-llama")


@pytest.fixture
def store(tmp_path):
    with PageStore(tmp_path / "s", StoreConfig()) as s:
        yield s


@pytest.mark.parametrize("ids, says", [
    ([65.9, 66.9], "flat sequence of int token ids"),  # was: deposited as 65, 66
    (["a", "b"], "flat sequence of int token ids"),  # was: taken as ids
    ([True, False], "a bool is not a token id"),  # was: taken as 1, 0
    ([1, 10 ** 30], "token id 1000000000000000000000000000000 is outside"),  # was: OverflowError
    ([1, -3], "token id -3 is outside"),  # was: IndexError
    ([[1, 2], [3, 4]], "flat sequence of int token ids"),  # was: ValueError
    (np.array([[1, 2], [3, 4]]), "flat sequence of int token ids"),
    (b"abc", "takes token ids, got bytes"),
])
def test_token_ids_are_checked_as_ingest_checks_them(lm, store, ids, says):
    with pytest.raises(TokenIdsError, match=says) as err:
        deposit(lm, ids, store, page_size=8)
    assert "\n" not in str(err.value) and "pass the text itself" in str(err.value)
    assert store.list_manifests() == [] and store_fingerprint(store) is None


def test_good_ids_of_any_int_kind_deposit_the_same_artifact(lm, store):
    ids = lm.codec.encode("the same tokens, three ways")
    arts = [deposit(lm, kind, store, page_size=8) for kind in (ids, np.asarray(ids), [np.int64(i) for i in ids])]
    assert len({a.artifact_id for a in arts}) == 1
    with pytest.raises(EmptyInputError, match="no token ids"):
        deposit(lm, [], store, page_size=8)


@pytest.mark.parametrize("page_size", [0, 7.5, -8, True, 1 << 17, "8"])
def test_a_page_size_that_is_not_a_positive_int_is_refused_before_anything_is_written(lm, store, page_size):
    with pytest.raises(ValueError, match=r"DepositOptions.page_size must be an int in 1\.\.65536 \(or None\)"):
        deposit(lm, "some text", store, page_size=page_size)  # was: 0 -> the default; 7.5 -> a "stored page"
    assert store.list_manifests() == [] and store_fingerprint(store) is None


def test_a_name_that_is_not_a_str_is_refused(lm, store):
    with pytest.raises(ValueError, match="name must be a str, got bytes"):
        deposit(lm, "some text", store, name=b"doc")


def test_a_closed_store_is_a_typed_error(lm, tmp_path):
    store = PageStore(tmp_path / "s", StoreConfig())
    art = deposit(lm, "kept before the close", store, page_size=8)
    store.close()
    for call in (store.list_manifests, lambda: store.get(art.page_keys[0]), lambda: store.get_meta("x"),
                 lambda: store.put_manifest("a", b"{}"), store.stats, lambda: deposit(lm, "more", store)):
        with pytest.raises(StoreClosedError, match="was closed; open it again"):  # was: a raw lmdb.Error
            call()


def test_a_bytes_store_path_is_a_typed_error(tmp_path):
    with pytest.raises(PagingError, match=r"is bytes; give it as a str or pathlib.Path"):  # was: TypeError
        PageStore(str(tmp_path / "s").encode(), StoreConfig())
    assert not (tmp_path / "s").exists()
