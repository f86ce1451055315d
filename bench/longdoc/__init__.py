"""Parts of `bench/longdoc_qa.py`: the working-set budget systems (budget.py, also asked by `ruler`), the page
rankings of `--systems signals` (signals.py), and the report's `tieredkv recheck` recipe (recipe.py)."""
