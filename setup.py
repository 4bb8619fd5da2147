"""Build the Cython extensions; everything else lives in pyproject.toml."""

from Cython.Build import cythonize
from setuptools import Extension, setup

EXTENSIONS = [
    Extension("proxy._framing", ["proxy/_framing.pyx"]),
    Extension("proxy.protocols.flymq._parser", ["proxy/protocols/flymq/_parser.pyx"]),
    Extension("proxy.protocols.rabbitmq_stream._parser",
              ["proxy/protocols/rabbitmq_stream/_parser.pyx"]),
    Extension("proxy.protocols.rocketmq._parser", ["proxy/protocols/rocketmq/_parser.pyx"]),
]

setup(
    ext_modules=cythonize(
        EXTENSIONS,
        compiler_directives={"language_level": "3", "embedsignature": True},
    ),
)
