"""The tiny web apps of the many-waiters scenario (:mod:`bench.manywaiters`), and the process that
serves one of them (``python -m bench._apps.serve``).

Every app has ``/ready`` (never cached: the benchmark polls it until the
server answers) and a cached page whose render is :meth:`bench._renders.RenderLog.render`,
written the way each framework's documentation writes cached views.
"""
