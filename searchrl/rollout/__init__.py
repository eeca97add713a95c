"""searchrl.rollout"""
