"""searchrl.data"""
