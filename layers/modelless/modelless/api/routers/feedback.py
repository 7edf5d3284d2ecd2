"""Feedback on answered queries, and the app's selection policy that learns from it (Clipper §5;
docs/QUERIES.md, "Selection from feedback"). Each call is the app's own: its API key (or the
admin key) and its query ids only."""

from __future__ import annotations

import hmac

from fastapi import APIRouter

from modelless.api.dependencies import KeyDep, ServicesDep
from modelless.api.openapi import AUTHENTICATED, NamePath, NameQuery, error_responses
from modelless.api.schemas import (
    Feedback,
    FeedbackReply,
    FeedbackStats,
    ModelFeedback,
    SelectionReply,
    SetSelection,
)
from modelless.api.services import Services
from modelless.exceptions import InvalidInputError, NotFoundError
from modelless.feedback.policy import Policy, shares
from modelless.feedback.service import GivenFeedback
from modelless.validation import check_name

router = APIRouter(prefix="/v1", tags=["feedback"])


@router.post("/feedback", responses=error_responses(*AUTHENTICATED, 400, 403, 404, 409, 413))
def give_feedback(body: Feedback, services: ServicesDep, key: KeyDep) -> FeedbackReply:
    """The true label of an answered query (one for every row, or one per row), or a reward in
    [0, 1]. The same feedback again answers as before and changes nothing; different feedback for
    a query that has some is a 409; a query id the app does not know (or older than the records
    are kept) is a 404."""
    services.keys.authorize(key, body.appID)
    if (body.label is None) == (body.reward is None):
        raise InvalidInputError("give either a label (or one per row) or a reward, not both")
    labels = None if body.label is None else body.label if isinstance(body.label, list) else [body.label]
    receipt = services.feedback.feedback(body.appID, body.queryId, GivenFeedback(labels, body.reward))
    return FeedbackReply(
        queryId=receipt.query_id,
        appID=body.appID,
        policy=receipt.policy.value,
        rewards=receipt.rewards,
        duplicate=receipt.duplicate,
    )


@router.get("/feedback/stats", responses=error_responses(*AUTHENTICATED, 400, 403))
def feedback_stats(appID: NameQuery, services: ServicesDep, key: KeyDep) -> FeedbackStats:
    """Per model of the app that has feedback: its live accuracy, and its bandit weights."""
    services.keys.authorize(key, appID)
    feedback = services.feedback
    outcomes = feedback.outcomes(appID)
    models = sorted(outcomes)
    exp3 = shares(feedback.store.weights(appID, Policy.EXP3), models)
    exp4 = shares(feedback.store.weights(appID, Policy.EXP4), models)
    return FeedbackStats(
        appID=appID,
        policy=feedback.selection(appID).value,
        models=[
            ModelFeedback(
                model=model,
                feedbacks=outcomes[model].feedbacks,
                accuracy=_rounded(outcomes[model].accuracy),
                recentAccuracy=_rounded(outcomes[model].recent_accuracy),
                recentFeedbacks=len(outcomes[model].recent),
                exp3Weight=round(exp3[model], 6),
                exp4Weight=round(exp4[model], 6),
            )
            for model in models
        ],
    )


@router.get("/apps/{appID}/selection", responses=error_responses(*AUTHENTICATED, 400, 403, 404))
def get_selection(appID: NamePath, services: ServicesDep, key: KeyDep) -> SelectionReply:
    _authorize_app(services, key, appID)
    return SelectionReply(appID=appID, policy=services.feedback.store.selection(appID).value)


@router.put("/apps/{appID}/selection", responses=error_responses(*AUTHENTICATED, 400, 403, 404, 413))
def set_selection(appID: NamePath, body: SetSelection, services: ServicesDep, key: KeyDep) -> SelectionReply:
    """How the app's queries that name no model are answered: ``infaas`` (the default), ``exp3``
    or ``exp4``. The bandits' weights are kept across changes."""
    _authorize_app(services, key, appID)
    services.feedback.set_selection(appID, Policy(body.policy))
    return SelectionReply(appID=appID, policy=body.policy)


def _authorize_app(services: Services, key: str | None, app_id: str) -> None:
    """The app's own key or the admin key; an app that does not exist is a 404."""
    check_name("appID", app_id)
    admin = services.settings.admin_key
    if admin and key and hmac.compare_digest(admin.encode(), key.encode()):
        if not services.store.app_exists(app_id):
            raise NotFoundError(f"app {app_id!r} does not exist", app=app_id)
        return
    services.keys.authorize(key, app_id)


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 6)
