"""The first module a fork server imports (:func:`hpcgnn.process.start_context`): the server ends with the process
that started it, however that one ends (SIGKILL too), and the processes it forked with it (their own
parent-death signal). Without this, the server would outlive a killed launcher as long as the ranks it forked
live, each holding its end of the server's liveness pipe: neither would ever end. Imported anywhere else, it
would tie that process to its parent: nothing else imports it.
"""

import signal

from hpcgnn import process

process.die_with_parent(signal.SIGKILL)
