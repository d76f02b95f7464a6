"""ftconsole: ftconsole."""
