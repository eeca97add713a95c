"""searchrl.search"""
