"""Run every index test against the native put/select kernels and their pure-Python reference."""
import pytest

from rmq_core.store.index import IndexFile
from tests.store_index.index_oracle import put_key_py, put_records_py, select_phy_offsets_py


@pytest.fixture(autouse=True, params=["native", "python"])
def index_impl(request, monkeypatch):
    if request.param == "python":
        monkeypatch.setattr(IndexFile, "put_key", put_key_py)
        monkeypatch.setattr(IndexFile, "put_records", put_records_py)
        monkeypatch.setattr(IndexFile, "select_phy_offsets", select_phy_offsets_py)
    return request.param
