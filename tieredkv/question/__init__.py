"""Question time: long-document QA over the memory tier.

    ask.py       one call per question: TieredModel.open / .ask / .chat, the Document and the Answer
    qa.py        the prompt's frame, the QA config, finding a stored document by its tokens
    reading.py   question-time reading: rank pages, read the chosen passages afresh
    reencode.py  re-encoding pages at question time (used by reading)
    corpus.py    the bundled default document
"""
