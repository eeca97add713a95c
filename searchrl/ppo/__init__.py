"""searchrl.ppo"""
