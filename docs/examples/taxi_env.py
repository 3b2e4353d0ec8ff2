"""Gymnasium's Taxi as a text env: the complete adapter of docs/adding-an-env.md."""

from collections import deque

from gymnasium.envs.toy_text.taxi import MAP, TaxiEnv

from actors.envs.base import EnvObservation, EnvTask, ResetOutcome, StepOutcome, TextEnv

ACTIONS = ["south", "north", "east", "west", "pickup", "dropoff"]  # index = gymnasium's action id
STOPS = ["R", "G", "Y", "B"]  # Taxi's stops by location index; passenger index 4 = in the taxi


class TaxiTextEnv(TextEnv):
    default_max_steps = 30

    def __init__(self, params=None, max_steps=None):
        super().__init__(params, max_steps)
        self.taxi, self.scout = TaxiEnv(), TaxiEnv()  # the scout looks up tasks for fingerprint()

    def task_types(self):
        return ["taxi"]

    def make_task(self, seed, split):
        return EnvTask(self.name, f"{self.name}/{split}/{seed}", "taxi", seed)

    def fingerprint(self, task):  # seeds map onto 300 start states: a panel holds out states, not seeds
        return str(self.scout.reset(seed=task.seed)[0])

    def reset(self, task):
        self.state, _ = self.taxi.reset(seed=task.seed)
        self.steps, self.done = 0, False
        return ResetOutcome(
            self.observe(), "Drive to the passenger, pick them up, drop them at the destination.", "taxi"
        )

    def step(self, action):
        move = (action or "").strip().lower()
        valid, reward, won = move in ACTIONS and not self.done, 0.0, False
        if valid:
            self.state, reward, won, _, _ = self.taxi.step(ACTIONS.index(move))
        self.steps += 1
        self.done = self.done or won or self.steps >= self.max_steps
        return StepOutcome(self.observe("" if valid else "Nothing happens.\n"), float(reward), self.done, won, valid)

    def expert_action(self):  # first move of a shortest path through Taxi's own transition table
        first, queue = {self.state: None}, deque([self.state])
        while queue:
            state = queue.popleft()
            for action, [(_, after, _, won)] in self.taxi.unwrapped.P[state].items():
                if after not in first:
                    first[after] = first[state] or ACTIONS[action]
                    queue.append(after)
                if won:
                    return first[after]
        return None

    def observe(self, prefix=""):
        row, col, passenger, destination = self.taxi.decode(self.state)
        board = [list(line) for line in MAP]
        board[1 + row][1 + 2 * col] = "T"
        where = "is in the taxi" if passenger == 4 else f"waits at {STOPS[passenger]}"
        text = (
            "\n".join("".join(line) for line in board) + f"\nThe passenger {where}; destination {STOPS[destination]}."
        )
        return EnvObservation(prefix + text, text, [] if self.done else list(ACTIONS))
