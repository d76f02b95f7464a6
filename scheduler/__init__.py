"""ftconsole: scheduler."""
