"""Studies that compare losses over seeds and lags, and write reports."""
