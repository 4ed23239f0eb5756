"""bench.receive_cost on a few MiB: every way takes the whole file, its hash is checked, the table prints."""

from __future__ import annotations

import pytest

from bench import receive_cost


def test_every_way_takes_the_whole_file_and_the_table_reads_it(tmp_path, capsys):
    spent = receive_cost.measure(tmp_path, 4 << 20, runs=2, ways=list(receive_cost.WAYS))
    assert set(spent) == set(receive_cost.WAYS)
    assert all(len(figures) == 2 and all(f > 0 for f in figures) for figures in spent.values())
    receive_cost.print_table(spent, 4 << 20, tmp_path)
    table = capsys.readouterr().out
    for way in receive_cost.WAYS:
        assert f"| {way} |" in table
    assert not list(tmp_path.glob("ws-receive-cost-*"))  # its files went with it


def test_a_copy_that_does_not_hash_to_the_file_stops_the_bench(tmp_path, monkeypatch):
    def zeros(path, size):  # a file whose sha256 is not the one given for it
        path.write_bytes(b"\0" * size)
        return "0" * 64

    monkeypatch.setattr(receive_cost, "make_source", zeros)
    with pytest.raises(SystemExit, match="sha256"):
        receive_cost.measure(tmp_path, 1 << 20, runs=1, ways=["recv+write+sha256"])


def test_a_paced_sender_delivers_the_whole_file_and_the_table_says_its_rate(tmp_path, capsys):
    spent = receive_cost.measure(tmp_path, 2 << 20, runs=1, ways=["polled+write+sha256"], rate=50e6)
    receive_cost.print_table(spent, 2 << 20, tmp_path, rate=50e6)
    assert "over loopback at 50 MB/s" in capsys.readouterr().out
