"""searchrl.rewards"""
