from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ElementType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ELEMENT_TYPE_UNSPECIFIED: _ClassVar[ElementType]
    FP32: _ClassVar[ElementType]
    FP16: _ClassVar[ElementType]
    FP64: _ClassVar[ElementType]
    INT8: _ClassVar[ElementType]
    INT16: _ClassVar[ElementType]
    INT32: _ClassVar[ElementType]
    INT64: _ClassVar[ElementType]
    UINT8: _ClassVar[ElementType]
    UINT16: _ClassVar[ElementType]
    UINT32: _ClassVar[ElementType]
    UINT64: _ClassVar[ElementType]
    BOOL: _ClassVar[ElementType]
ELEMENT_TYPE_UNSPECIFIED: ElementType
FP32: ElementType
FP16: ElementType
FP64: ElementType
INT8: ElementType
INT16: ElementType
INT32: ElementType
INT64: ElementType
UINT8: ElementType
UINT16: ElementType
UINT32: ElementType
UINT64: ElementType
BOOL: ElementType

class Tensor(_message.Message):
    __slots__ = ("name", "dtype", "shape", "raw_data")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    RAW_DATA_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: ElementType
    shape: _containers.RepeatedScalarFieldContainer[int]
    raw_data: bytes
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[ElementType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., raw_data: _Optional[bytes] = ...) -> None: ...

class PredictRequest(_message.Message):
    __slots__ = ("data", "shape", "model_name", "model_version", "request_id", "priority", "timeout_ms", "raw_data", "dtype", "inputs", "output_names")
    DATA_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    RAW_DATA_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_NAMES_FIELD_NUMBER: _ClassVar[int]
    data: _containers.RepeatedScalarFieldContainer[float]
    shape: _containers.RepeatedScalarFieldContainer[int]
    model_name: str
    model_version: str
    request_id: str
    priority: int
    timeout_ms: int
    raw_data: bytes
    dtype: ElementType
    inputs: _containers.RepeatedCompositeFieldContainer[Tensor]
    output_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, data: _Optional[_Iterable[float]] = ..., shape: _Optional[_Iterable[int]] = ..., model_name: _Optional[str] = ..., model_version: _Optional[str] = ..., request_id: _Optional[str] = ..., priority: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., raw_data: _Optional[bytes] = ..., dtype: _Optional[_Union[ElementType, str]] = ..., inputs: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., output_names: _Optional[_Iterable[str]] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class PredictResponse(_message.Message):
    __slots__ = ("predictions", "shape", "request_id", "model_name", "model_version", "outputs", "error")
    PREDICTIONS_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    predictions: _containers.RepeatedScalarFieldContainer[float]
    shape: _containers.RepeatedScalarFieldContainer[int]
    request_id: str
    model_name: str
    model_version: str
    outputs: _containers.RepeatedCompositeFieldContainer[Tensor]
    error: Error
    def __init__(self, predictions: _Optional[_Iterable[float]] = ..., shape: _Optional[_Iterable[int]] = ..., request_id: _Optional[str] = ..., model_name: _Optional[str] = ..., model_version: _Optional[str] = ..., outputs: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ("ready_only",)
    READY_ONLY_FIELD_NUMBER: _ClassVar[int]
    ready_only: bool
    def __init__(self, ready_only: bool = ...) -> None: ...

class TensorSpec(_message.Message):
    __slots__ = ("name", "datatype", "shape", "optional")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DATATYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    OPTIONAL_FIELD_NUMBER: _ClassVar[int]
    name: str
    datatype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    optional: bool
    def __init__(self, name: _Optional[str] = ..., datatype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., optional: bool = ...) -> None: ...

class ModelEntry(_message.Message):
    __slots__ = ("name", "version", "state", "reason", "inputs", "outputs", "max_batch_size")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    state: str
    reason: str
    inputs: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    outputs: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    max_batch_size: int
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ..., inputs: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., outputs: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., max_batch_size: _Optional[int] = ...) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelEntry]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelEntry, _Mapping]]] = ...) -> None: ...

class ClassifyRequest(_message.Message):
    __slots__ = ("image", "model_name", "top_k", "request_id", "priority", "timeout_ms")
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    image: bytes
    model_name: str
    top_k: int
    request_id: str
    priority: int
    timeout_ms: int
    def __init__(self, image: _Optional[bytes] = ..., model_name: _Optional[str] = ..., top_k: _Optional[int] = ..., request_id: _Optional[str] = ..., priority: _Optional[int] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class Classification(_message.Message):
    __slots__ = ("index", "label", "score")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    index: int
    label: str
    score: float
    def __init__(self, index: _Optional[int] = ..., label: _Optional[str] = ..., score: _Optional[float] = ...) -> None: ...

class ClassifyResponse(_message.Message):
    __slots__ = ("classes", "request_id", "model_name", "model_version")
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    classes: _containers.RepeatedCompositeFieldContainer[Classification]
    request_id: str
    model_name: str
    model_version: str
    def __init__(self, classes: _Optional[_Iterable[_Union[Classification, _Mapping]]] = ..., request_id: _Optional[str] = ..., model_name: _Optional[str] = ..., model_version: _Optional[str] = ...) -> None: ...
