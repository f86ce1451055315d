"""The library of verified solutions: problems answered from grafted pages in a few decode tokens.

    solutions.py  Library: add (deposit a problem, check the answer), solve (graft, decode, verify)
    entries.py    LibraryIndex: the entries kept beside the pages in the store
    verifiers.py  answer checkers (exact text, numbers, Python tests) and their identities
"""
