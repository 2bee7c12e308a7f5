"""One module per notebook: `run(params) -> tables` does the experiment (loads models, runs the
line-up through the benchmark, derives the tables, writes summary.csv and headline.json);
`findings(tables)` says in words what the numbers show. `lineups` builds every Method."""
