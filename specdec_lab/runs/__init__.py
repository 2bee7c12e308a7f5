"""Infrastructure at the bottom of the kit: where things go (`paths`), how rows are stored
(`jsonl`), what a notebook leaves for the summary (`outputs`), and the benchmark runner (`bench`).
`paths`, `jsonl` and `outputs` import nothing else of the kit."""
