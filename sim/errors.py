"""The one exception type that means "the user's input is wrong"."""


class ConfigError(ValueError):
    """Bad user input: names the field, the value, and what would be valid.

    Entry points print ``str(error)`` as a single line and exit with code 2.
    """

    def __init__(self, field: str, value: object, expected: str) -> None:
        self.field, self.value, self.expected = field, value, expected
        super().__init__(f"{field}={value!r}: {expected}")
