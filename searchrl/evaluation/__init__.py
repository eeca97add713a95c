"""searchrl.evaluation: held-out evaluation (`evaluate`), the reward-hacking audit (`audit`) and the report.

`evaluate.evaluate_policy` is the one evaluation loop used by training-time validation and by
`searchrl eval`; `audit.audit_run` checks a run for reward hacking; `report.write_report` writes the
self-contained `report.html`. Import the submodules directly (they pull in torch and matplotlib lazily).
"""
