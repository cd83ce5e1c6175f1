"""Providers of other frameworks' sandbox interfaces."""
