"""searchrl.grpo"""
