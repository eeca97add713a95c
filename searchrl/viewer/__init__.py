"""searchrl.viewer"""
