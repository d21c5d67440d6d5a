"""hpcgnn's C kernels, a package of their own that sampling and exact inference both import (the hops, id maps and
gathers of sampling; the sums and means over the CSR of exact inference's layers): the C sources (one concern each,
``kernels.h`` says which), their build and checks
(``build``), the ctypes binding (``binding``), the operations the samplers call (``ops``), each with its torch twin
of the same signature (``twins``: the same results, bit for bit, where the C kernels are not), the threads they run
on (``scheduler``) and a partitioned rank's id map (``hashtable``)."""
