"""What an operator runs beside the workers: the `obsq` command's inspection and repair
commands (`admin.py`) and their output (`terminal.py`), `obsq doctor`, `obsq demo`, the
supervisor of `--processes N`, and the web console (`ui/`). The top of the package: it may
import every layer, and nothing imports it but `obsq.cli`."""
