"""searchrl.sft"""
