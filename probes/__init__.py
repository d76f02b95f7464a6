"""ftconsole: probes."""
