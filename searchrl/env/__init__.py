"""searchrl.env"""
