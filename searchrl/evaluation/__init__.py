"""searchrl.evaluation: held-out evaluation, the reward-hacking audit and the report.

`loop.evaluate_policy` is the one evaluation loop used by training-time validation and by `searchrl eval`
(`statistics` summarises its trajectories, `targets` resolves what `searchrl eval` evaluates);
`audit.audit_run` runs the `checks` on a run; `report.write_report` writes the self-contained `report.html`.
Every run file is read through `searchrl.run.reader.RunReader`. Import the submodules directly (they pull in
torch and matplotlib lazily).
"""

# The metrics every summary leads with: the demo's headline, the terminal table and the report rows.
HEADLINE_METRICS: tuple[str, ...] = (
    "exact_match",
    "f1",
    "citation_support",
    "format_valid",
    "searches_per_question",
    "tool_failure_rate",
)
