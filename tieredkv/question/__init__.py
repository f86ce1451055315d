"""Question time: long-document QA over the memory tier.

    qa.py        what `tieredkv qa` runs: the prompt's frame, the QA config, finding a stored document
    reading.py   question-time reading: rank pages, read the chosen passages afresh
    reencode.py  re-encoding pages at question time (used by reading)
    corpus.py    the bundled default document
"""
