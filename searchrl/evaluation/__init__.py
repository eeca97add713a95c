"""searchrl.evaluation: held-out evaluation (`evaluate`), the reward-hacking audit (`audit`) and the report.

`loop.evaluate_policy` is the one evaluation loop used by training-time validation and by
`searchrl eval`; `audit.audit_run` checks a run for reward hacking; `report.write_report` writes the
self-contained `report.html`. Import the submodules directly (they pull in torch and matplotlib lazily).
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
