"""searchrl.models"""
