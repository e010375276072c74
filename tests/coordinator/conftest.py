from tests.dbs import db

__all__ = ["db"]
